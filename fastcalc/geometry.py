"""Differentiable geometry: edge vectors, and energy → forces and stress in one pass.

These functions run inside compiled or traced model code: everything a force
depends on is computed here from positions, cell and integer topology.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["batch_energies_forces_stress", "edge_vectors", "energy_forces_stress"]


def edge_vectors(
    positions: torch.Tensor,
    cell: torch.Tensor,
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    edge_system: torch.Tensor | None = None,
) -> torch.Tensor:
    """``positions[j] - positions[i] + unit_shifts @ cell`` for every edge ``(i, j)``;
    for a batch, ``cell`` is (B, 3, 3) and ``edge_system`` (E,) gives each edge's system."""
    i, j = edge_index
    shifts = unit_shifts.to(cell.dtype)
    if cell.dim() == 3:
        offsets = torch.bmm(shifts.unsqueeze(1), cell[edge_system]).squeeze(1)
    else:
        offsets = shifts @ cell
    return positions[j] - positions[i] + offsets


def energy_forces_stress(
    energy_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    positions: torch.Tensor,
    cell: torch.Tensor,
    compute_stress: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Energy, forces ``-dE/dx`` and stress ``(1/V) dE/dε`` (3x3) from one backward pass.

    ``energy_fn(positions, cell)`` returns the total energy. Stress comes from a
    homogeneous strain ``ε`` applied to positions and cell alike, ASE's sign
    convention (positive under tension). Without ``compute_stress`` the stress is None.
    Gradients are enabled here, so callers may run under ``torch.no_grad()``.
    """
    positions = positions.detach().requires_grad_(True)
    with torch.enable_grad():
        if not compute_stress:
            energy = energy_fn(positions, cell)
            (grad,) = torch.autograd.grad(energy, positions)
            return energy.detach(), -grad, None
        options = {"dtype": positions.dtype, "device": positions.device}
        strain = torch.zeros((3, 3), **options, requires_grad=True)
        deformation = torch.eye(3, **options) + strain
        energy = energy_fn(positions @ deformation, cell @ deformation)
        grad, virial = torch.autograd.grad(energy, (positions, strain))
    return energy.detach(), -grad, virial / cell_volumes(cell)


def batch_energies_forces_stress(
    atom_energy_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    positions: torch.Tensor,
    cells: torch.Tensor,
    system_index: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`energy_forces_stress` for B systems in one backward pass.

    ``atom_energy_fn(positions, cells)`` returns the (N,) per-atom energies (zero for
    padded atoms) of the systems of ``cells`` (B, 3, 3), atom ``n`` belonging to system
    ``system_index[n]``. Returns the systems' energies (B,), summed in float64, the
    forces, the stresses (B, 3, 3) and the per-atom energies. Each system has its own
    strain, so each stress is ``(1/V_b) dE_b/dε_b``; forces are ``-dE/dx`` of the sum,
    which, systems sharing no edges, are each system's own.
    """
    positions = positions.detach().requires_grad_(True)
    with torch.enable_grad():
        options = {"dtype": positions.dtype, "device": positions.device}
        strain = torch.zeros(cells.shape, **options, requires_grad=True)
        deformation = torch.eye(3, **options) + strain
        deformed = torch.bmm(positions.unsqueeze(1), deformation[system_index]).squeeze(1)
        atom_energies = atom_energy_fn(deformed, torch.bmm(cells, deformation))
        energies = atom_energies.new_zeros(cells.shape[0], dtype=torch.float64).index_add(
            0, system_index, atom_energies.to(torch.float64)
        )
        grad, virial = torch.autograd.grad(energies.sum(), (positions, strain))
    return energies.detach(), -grad, virial / cell_volumes(cells).view(-1, 1, 1), atom_energies.detach()


def cell_volumes(cells: torch.Tensor) -> torch.Tensor:
    """Volumes ``|a . (b x c)|`` of cells (..., 3, 3) whose rows are the cell vectors.

    The triple product rather than ``torch.linalg.det``: inside a compiled graph it is one
    fused elementwise kernel, where the determinant is a call out of the generated code
    (an LU factorisation on CUDA)."""
    return (cells[..., 0, :] * torch.linalg.cross(cells[..., 1, :], cells[..., 2, :])).sum(-1).abs()
