"""PET energy, forces and stress as one traceable function, compiled whole with its layout stage.

:func:`energy_graph` is the model's graph: positions, cell and a given layout ->
per-atom energies, forces and stress, with the forward and the autograd backward
recorded by :func:`fastcalc.tracing.trace` as one aten graph with symbolic sizes.
:func:`step_graph` puts the layout stage in front of it
(:func:`fastcalc.pet.layout.layout_function`: no gradients, integer and boolean
outputs), so that one compiled graph, and under CUDA graphs one replay, runs a whole
evaluation; the layout still enters the model's part only as integers and masks. Its
flat inputs (:func:`graph_inputs`) are positions, cell, a mask of real atoms, the
[charge, spin multiplicity] state, the species, the candidate pairs and ``arange(K)``
for K neighbour slots, so that padding, charge and spin change inputs, never the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..tracing import trace
from .core import PETCore
from .energy import energy_and_derivatives
from .layout import Candidates, PETLayout, layout_function

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def graph_inputs(
    positions: torch.Tensor,
    cell: torch.Tensor,
    species: torch.Tensor,
    candidates: Candidates,
    slots: torch.Tensor,
    atom_mask: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """:func:`step_graph`'s flat inputs for a layout of K = len(``slots``) slots
    (``slots`` is ``arange(K)``); ``atom_mask=None`` means every atom is real.

    ``state`` is the int64 [charge, spin multiplicity] (default [0, 1]); it is not
    checked here (the graph cannot): use ``PETCore.conditioning.check`` first.
    """
    device = positions.device
    if atom_mask is None:
        atom_mask = torch.ones(len(positions), dtype=torch.bool, device=device)
    if state is None:
        state = torch.tensor([0, 1], device=device)
    return (positions, cell, atom_mask, state, species, *candidates, slots)


def energy_graph(core: PETCore) -> Callable[..., Outputs]:
    """The model's function: (positions, cell, atom_mask, state, *layout) -> (per-atom
    energies, forces, dE/dstrain / volume).

    Model units, as :func:`fastcalc.pet.energy.energy_and_derivatives` with stress;
    padded atoms (``atom_mask`` False) are left out of the energy.
    """

    def run(
        positions: torch.Tensor,
        cell: torch.Tensor,
        atom_mask: torch.Tensor,
        state: torch.Tensor,
        *layout: torch.Tensor,
    ) -> Outputs:
        return energy_and_derivatives(
            core, positions, cell, PETLayout(*layout), True, state[0], state[1], atom_mask
        )

    return run


def step_graph(core: PETCore) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The layout stage then :func:`energy_graph`: :func:`graph_inputs` -> (per-atom
    energies, forces, dE/dstrain / volume, layout status).

    The results hold only if the status's largest neighbour count fits the width and
    its symmetry flag is 1 (see :func:`fastcalc.pet.layout.device_layout`).
    """
    layout_stage = layout_function(core.hypers)
    energy = energy_graph(core)

    def run(
        positions: torch.Tensor,
        cell: torch.Tensor,
        atom_mask: torch.Tensor,
        state: torch.Tensor,
        species: torch.Tensor,
        *candidates_and_slots: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        *layout, status = layout_stage(positions, cell, species, *candidates_and_slots)
        return (*energy(positions, cell, atom_mask, state, *layout), status)

    return run


def trace_pet(core: PETCore, inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """:func:`step_graph` traced on example ``inputs`` (see :func:`graph_inputs`).

    The example only fixes dtypes and which sizes are symbolic. The weights become
    graph attributes sharing the core's storage; they must not require gradients,
    or the compiler would differentiate the backward pass too.
    """
    if any(parameter.requires_grad for parameter in core.parameters()):
        raise ValueError(
            "trace a PETCore whose weights do not require grad (requires_grad_(False))"
        )
    return trace(step_graph(core), inputs)
