"""A fresh process for tests/test_saved_graph.py: ``save FOLDER`` traces the toy model's
graph, compiles it ahead of time and pickles the saved graph into FOLDER, ``load FOLDER``
loads it without tracing; either prints the energy and forces of ``ATOMS`` atoms, and
with ``--scale S`` after scaling one weight in place."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import torch
from torch import nn

from fastcalc.saved_graph import LoadedGraph, compile_ahead
from fastcalc.tracing import trace


class Toy(nn.Module):
    """Energy of atoms: tanh of a linear map of their positions, weighted per species."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 8).requires_grad_(False)
        self.register_buffer("scale", torch.tensor(0.5))
        self.weights = torch.randn(4)  # a plain tensor attribute

    def energy_and_forces(self, positions: torch.Tensor, species: torch.Tensor):
        with torch.enable_grad():
            positions = positions.detach().requires_grad_(True)
            per_atom = torch.tanh(self.linear(positions)).sum(-1) * self.weights[species]
            energy = per_atom.sum() * self.scale
            (gradient,) = torch.autograd.grad(energy, positions)
        return energy.detach(), -gradient


def inputs(atoms: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(atoms)
    positions = torch.randn(atoms, 3, generator=generator, dtype=torch.float32)
    return positions, torch.arange(atoms) % 4


if __name__ == "__main__":
    mode, folder, atoms = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    toy = Toy()
    if mode == "save":
        graph = trace(toy.energy_and_forces, inputs(5))
        run, saved = compile_ahead(graph, toy, inputs(5))
        (folder / "toy.pickle").write_bytes(pickle.dumps(saved))
    else:
        run = LoadedGraph.load(pickle.loads((folder / "toy.pickle").read_bytes()), toy)
    if "--scale" in sys.argv:
        toy.linear.weight.mul_(float(sys.argv[sys.argv.index("--scale") + 1]))
    energy, forces = run(*inputs(atoms))
    print(json.dumps({"energy": float(energy), "forces": forces.tolist()}))
