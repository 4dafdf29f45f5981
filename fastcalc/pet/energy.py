"""Energy, forces and stress of a PET model from one autograd pass through a strain.

Positions and cell are both deformed by (I + strain): dE/dpositions gives forces and
the symmetric part of dE/dstrain / volume the stress (PET is not exactly rotation
invariant, so dE/dstrain has a small antisymmetric part, which ASE's Voigt stress
drops as well). The model's energy scale and per-element composition energies are
applied afterwards, in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..buckets import padding_cell
from ..geometry import batch_energies_forces_stress, energy_forces_stress
from .core import PETCore
from .layout import PETLayout


@dataclass(frozen=True)
class EnergyReference:
    """Affine map from network output to energy: E_i = scale * e_i + composition[type_i]."""

    scale: float
    composition: torch.Tensor  # (num_species,) float64, ordered like PETCore.atomic_types


@dataclass(frozen=True)
class PETResult:
    """Float64 outputs for one structure, on the host (stress is None for a zero-volume cell)."""

    energy: float
    energies: np.ndarray
    forces: np.ndarray
    stress: np.ndarray | None


def energy_and_derivatives(
    core: PETCore,
    positions: torch.Tensor,
    cell: torch.Tensor,
    layout: PETLayout,
    compute_stress: bool = True,
    charge: int | torch.Tensor = 0,
    spin_multiplicity: int | torch.Tensor = 1,
    atom_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Network per-atom energies (n,), forces (n, 3) and dE/dstrain / volume (3, 3) or None.

    Model units, before the energy reference; one backward pass (see
    :func:`fastcalc.geometry.energy_forces_stress`). Atoms where ``atom_mask`` is False
    (padding, see :mod:`fastcalc.pet.padding`) are left out of the total energy.
    """
    per_atom: list[torch.Tensor] = []

    def total_energy(deformed_positions: torch.Tensor, deformed_cell: torch.Tensor) -> torch.Tensor:
        per_atom.append(core(deformed_positions, deformed_cell, layout, charge, spin_multiplicity))
        if atom_mask is None:
            return per_atom[0].sum()
        return torch.where(atom_mask, per_atom[0], 0.0).sum()

    _, forces, stress = energy_forces_stress(total_energy, positions, cell.detach(), compute_stress)
    return per_atom[0].detach(), forces, stress


def batch_energies_and_derivatives(
    core: PETCore,
    positions: torch.Tensor,
    cells: torch.Tensor,
    system_index: torch.Tensor,
    layout: PETLayout,
    states: torch.Tensor,
    atom_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`energy_and_derivatives` for a batch of B systems in one layout: network
    per-atom energies (n,), forces (n, 3) and each system's dE/dstrain / volume (B, 3, 3).

    ``cells`` (B, 3, 3), ``system_index`` (n,) each atom's system, ``states`` (B, 2) each
    system's [charge, spin multiplicity] (see :func:`fastcalc.geometry.batch_energies_forces_stress`).
    """

    def atom_energies(deformed_positions: torch.Tensor, deformed_cells: torch.Tensor) -> torch.Tensor:
        energies = core(
            deformed_positions, deformed_cells[system_index], layout, states[:, 0], states[:, 1],
            system_index,
        )
        return torch.where(atom_mask, energies, 0.0)

    _, forces, stresses, energies = batch_energies_forces_stress(
        atom_energies, positions, cells.detach(), system_index
    )
    return energies, forces, stresses


def apply_reference(
    reference: EnergyReference,
    species: np.ndarray,
    energies: np.ndarray,
    forces: np.ndarray,
    stress: np.ndarray | None,
) -> PETResult:
    """Scale network outputs, add composition energies and symmetrise the stress, in float64.

    Host arrays in, host arrays out: this runs after every calculator call, on a few
    thousand numbers, where numpy costs a fraction of torch's per-operation overhead.
    """
    scale = reference.scale
    atom_energies = scale * np.asarray(energies, np.float64) + reference.composition.numpy()[species]
    if stress is not None:
        stress = np.asarray(stress, np.float64)
        stress = scale * 0.5 * (stress + stress.T)
    forces = scale * np.asarray(forces, np.float64)
    return PETResult(float(atom_energies.sum()), atom_energies, forces, stress)


def evaluate(
    core: PETCore,
    reference: EnergyReference,
    positions: torch.Tensor,
    cell: torch.Tensor,
    layout: PETLayout,
    charge: int = 0,
    spin_multiplicity: int = 1,
) -> PETResult:
    """Total and per-atom energies, forces and (for a non-zero volume) stress in float64,
    as host arrays.

    Inputs are in the core's dtype; ``layout`` is built for ``padding_cell(cell, cutoff)``
    (as :func:`fastcalc.pet.layout.structure_layout` does), which the model is given.
    """
    compute_stress = bool(torch.linalg.det(cell.detach().double()).abs() > 0.0)
    model_cell = padding_cell(cell, core.hypers.cutoff)
    outputs = energy_and_derivatives(
        core, positions, model_cell, layout, compute_stress, charge, spin_multiplicity
    )
    energies, forces, stress = (
        None if x is None else x.detach().cpu().double().numpy() for x in outputs
    )
    return apply_reference(reference, layout.species.cpu().numpy(), energies, forces, stress)
