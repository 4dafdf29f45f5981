"""PET energy + forces + stress as one traced graph, compiled whole.

:func:`fastcalc.tracing.trace` records the forward and the autograd backward as a
single aten graph with symbolic sizes (atoms, neighbour slots, adaptive-cutoff pairs);
:class:`fastcalc.tracing.CompiledGraph` compiles it once for all structure sizes.
The graph takes flat tensors (:func:`graph_inputs`): positions, cell, a mask of real
atoms, the [charge, spin multiplicity] state and the layout tensors, so that padding,
charge and spin change inputs, never the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..tracing import CompiledGraph, trace
from .core import PETCore
from .energy import energy_and_derivatives
from .layout import PETLayout

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def graph_inputs(
    positions: torch.Tensor,
    cell: torch.Tensor,
    layout: PETLayout,
    atom_mask: torch.Tensor | None = None,
    charge: int = 0,
    spin_multiplicity: int = 1,
) -> tuple[torch.Tensor, ...]:
    """The graph's flat inputs; ``atom_mask=None`` means every atom is real.

    ``charge`` and ``spin_multiplicity`` are not checked here (the graph cannot):
    use ``PETCore.conditioning.check`` first.
    """
    device = positions.device
    if atom_mask is None:
        atom_mask = torch.ones(len(positions), dtype=torch.bool, device=device)
    state = torch.tensor([charge, spin_multiplicity], device=device)
    return (positions, cell, atom_mask, state, *layout)


def energy_graph(core: PETCore) -> Callable[..., Outputs]:
    """The traced function: flat inputs -> (per-atom energies, forces, dE/dstrain / volume).

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


def trace_pet(core: PETCore, inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """:func:`energy_graph` traced on example ``inputs`` (see :func:`graph_inputs`).

    The example only fixes dtypes and which sizes are symbolic. The weights become
    graph attributes sharing the core's storage; they must not require gradients,
    or the compiler would differentiate the backward pass too.
    """
    if any(parameter.requires_grad for parameter in core.parameters()):
        raise ValueError(
            "trace a PETCore whose weights do not require grad (requires_grad_(False))"
        )
    return trace(energy_graph(core), inputs)


def compile_pet(
    core: PETCore, inputs: Sequence[torch.Tensor], mode: str | None = None
) -> CompiledGraph:
    """``torch.compile(dynamic=True, fullgraph=True, mode=mode)`` of :func:`trace_pet`'s graph.

    Under ``mode="reduce-overhead"`` the weights are marked as static addresses, so
    CUDA graph replays read them in place instead of copying them every call.
    """
    graph_module = trace_pet(core, inputs)
    if mode == "reduce-overhead":
        for tensor in [*graph_module.parameters(), *graph_module.buffers()]:
            torch._dynamo.mark_static_address(tensor)
    return CompiledGraph(graph_module, dynamic=True, mode=mode)
