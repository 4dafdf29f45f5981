"""PET energy, forces and stress as one traceable function, compiled whole with its layout stage.

:class:`StepGraph` runs the layout stage (:func:`fastcalc.pet.layout.device_layout`:
no gradients, integer and boolean outputs) and then the model's per-atom energies,
forces and stress on that layout, the forward and the autograd backward recorded by
:func:`fastcalc.tracing.trace` as one aten graph with symbolic sizes, so that one
compiled graph, and under CUDA graphs one replay, runs a whole evaluation; the layout
enters the model's part only as integers and masks. Its flat inputs
(:func:`graph_inputs`) are positions, cell, a mask of real atoms, the [charge, spin
multiplicity] state, the species, the candidate pairs and ``arange(K)`` for K
neighbour slots, so that padding, charge and spin change inputs, never the graph.
:class:`BatchGraph` is the same for a batch of structures in one layout, with per-system
cells, states and strains.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..tracing import trace
from .core import PETCore
from .energy import batch_energies_and_derivatives, energy_and_derivatives
from .layout import Candidates, device_layout


def graph_inputs(
    positions: torch.Tensor,
    cell: torch.Tensor,
    species: torch.Tensor,
    candidates: Candidates,
    slots: torch.Tensor,
    atom_mask: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """:class:`StepGraph`'s flat inputs for a layout of K = len(``slots``) slots
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


class StepGraph:
    """The layout stage then the model: :func:`graph_inputs` -> (per-atom energies,
    forces, dE/dstrain / volume, layout status), the function a calculator compiles.

    The layout (:func:`fastcalc.pet.layout.device_layout`: no gradients, integer and
    boolean outputs) is chosen on the current geometry, then
    :func:`fastcalc.pet.energy.energy_and_derivatives` runs with stress on it, in model
    units; padded atoms (``atom_mask`` False) are left out of the energy. The results
    hold only if the status's largest neighbour count fits the width and its symmetry
    flag is 1. An object holding its core, not a closure, so that it pickles and
    deep-copies along with the core.
    """

    def __init__(self, core: PETCore) -> None:
        self.core = core

    def __call__(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        atom_mask: torch.Tensor,
        state: torch.Tensor,
        species: torch.Tensor,
        neighbors: torch.Tensor,
        shifts: torch.Tensor,
        reverse: torch.Tensor,
        slots: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Per-atom energies, forces, dE/dstrain / volume and the layout status."""
        candidates = Candidates(neighbors, shifts, reverse)
        layout, status = device_layout(
            positions, cell, species, candidates, slots, self.core.hypers
        )
        energies, forces, virial = energy_and_derivatives(
            self.core, positions, cell, layout, True, state[0], state[1], atom_mask
        )
        return energies, forces, virial, status


class BatchGraph:
    """:class:`StepGraph` for B structures packed into one layout: (positions, cells
    (B, 3, 3), system_index (n,), atom_mask, states (B, 2), species, neighbors, shifts,
    reverse, slots) -> (per-atom energies, forces, each system's dE/dstrain / volume
    (B, 3, 3), layout status).

    The layout is chosen with each atom's own cell, ``cells[system_index]``, inside the
    graph, as everything a force depends on; ``system_index`` and the candidates (rows
    of the concatenated atoms, see :mod:`fastcalc.pet.layout`) are integer inputs.
    """

    def __init__(self, core: PETCore) -> None:
        self.core = core

    def __call__(
        self,
        positions: torch.Tensor,
        cells: torch.Tensor,
        system_index: torch.Tensor,
        atom_mask: torch.Tensor,
        states: torch.Tensor,
        species: torch.Tensor,
        neighbors: torch.Tensor,
        shifts: torch.Tensor,
        reverse: torch.Tensor,
        slots: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Per-atom energies, forces, per-system dE/dstrain / volume and the layout status."""
        candidates = Candidates(neighbors, shifts, reverse)
        layout, status = device_layout(
            positions, cells[system_index], species, candidates, slots, self.core.hypers
        )
        energies, forces, virials = batch_energies_and_derivatives(
            self.core, positions, cells, system_index, layout, states, atom_mask
        )
        return energies, forces, virials, status


def trace_pet(core: PETCore, inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """:class:`StepGraph` traced on example ``inputs`` (see :func:`graph_inputs`).

    The example only fixes dtypes and which sizes are symbolic. The weights become
    graph attributes sharing the core's storage; they must not require gradients,
    or the compiler would differentiate the backward pass too.
    """
    if any(parameter.requires_grad for parameter in core.parameters()):
        raise ValueError(
            "trace a PETCore whose weights do not require grad (requires_grad_(False))"
        )
    return trace(StepGraph(core), inputs)
