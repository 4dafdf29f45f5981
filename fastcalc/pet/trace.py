"""PET energy + forces + stress as one traced graph, compiled whole.

:func:`fastcalc.tracing.trace` records the forward and the autograd backward as a
single aten graph with symbolic sizes (atoms, neighbour slots, adaptive-cutoff pairs);
:class:`fastcalc.tracing.CompiledGraph` compiles it once for all structure sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..tracing import CompiledGraph, trace
from .core import PETCore
from .energy import energy_and_derivatives
from .layout import PETLayout

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def trace_pet(
    core: PETCore,
    positions: torch.Tensor,
    cell: torch.Tensor,
    layout: PETLayout,
    charge: int = 0,
    spin_multiplicity: int = 1,
) -> torch.fx.GraphModule:
    """Graph of (positions, cell, *layout) -> (per-atom energies, forces, dE/dstrain / volume).

    Model units, as :func:`fastcalc.pet.energy.energy_and_derivatives` with stress; the
    example inputs only fix dtypes and which sizes are symbolic (use a 3D-periodic cell).
    The weights are graph attributes sharing the core's storage; they must not require
    gradients, or the compiler would differentiate the backward pass too.
    """
    if any(parameter.requires_grad for parameter in core.parameters()):
        raise ValueError(
            "trace a PETCore whose weights do not require grad (requires_grad_(False))"
        )

    def flat(positions: torch.Tensor, cell: torch.Tensor, *layout_tensors: torch.Tensor) -> Outputs:
        layout = PETLayout(*layout_tensors)
        return energy_and_derivatives(
            core, positions, cell, layout, True, charge, spin_multiplicity
        )

    return trace(flat, [positions, cell, *layout])


def compile_pet(
    core: PETCore,
    positions: torch.Tensor,
    cell: torch.Tensor,
    layout: PETLayout,
    charge: int = 0,
    spin_multiplicity: int = 1,
) -> Callable[[torch.Tensor, torch.Tensor, PETLayout], Outputs]:
    """``torch.compile(dynamic=True, fullgraph=True)`` of :func:`trace_pet`'s graph."""
    compiled = CompiledGraph(
        trace_pet(core, positions, cell, layout, charge, spin_multiplicity), dynamic=True
    )

    def run(positions: torch.Tensor, cell: torch.Tensor, layout: PETLayout) -> Outputs:
        return compiled(positions, cell, *layout)

    return run
