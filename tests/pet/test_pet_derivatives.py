"""Forces and stress are the exact derivatives of fastcalc's own PET energy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastcalc.pet.energy import evaluate
from fastcalc.pet.layout import structure_layout

from .support import make_structure

STEP = 1e-4
CHECKED_ATOMS = 4  # finite differences of the first atoms keep the test fast
STRAIN_STEP = 1e-5
RTOL = 1e-6


def frozen_energy_function(core, metadata, atoms):
    """Total float64 energy as a function of (positions, cell), neighbours fixed at ``atoms``."""
    positions = torch.tensor(atoms.positions, dtype=metadata.dtype)
    cell = torch.tensor(atoms.cell.array, dtype=metadata.dtype)
    layout = structure_layout(
        positions, cell, atoms.pbc, torch.tensor(atoms.numbers), metadata.hypers, core.species_index
    )
    reference = metadata.reference()

    def energy(new_positions: torch.Tensor, new_cell: torch.Tensor) -> float:
        with torch.no_grad():
            per_atom = core(new_positions, new_cell, layout)
        return float(
            reference.scale * per_atom.double().sum() + reference.composition[layout.species].sum()
        )

    result = evaluate(core, reference, positions, cell, layout)
    return energy, positions, cell, result


@pytest.mark.parametrize(
    ("model", "structure"), [("fixed", "bulk"), ("adaptive", "bulk"), ("adaptive", "tiny")]
)
def test_forces_are_minus_the_energy_gradient(model, structure, loaded):
    energy, positions, cell, result = frozen_energy_function(
        *loaded(model), make_structure(structure)
    )
    numerical = np.zeros((min(CHECKED_ATOMS, len(positions)), 3))
    for index in np.ndindex(*numerical.shape):
        step = torch.zeros_like(positions)
        step[index] = STEP
        numerical[index] = -(energy(positions + step, cell) - energy(positions - step, cell)) / (
            2 * STEP
        )
    error = np.abs(result.forces[: len(numerical)] - numerical).max()
    assert error < RTOL * np.abs(numerical).max()


@pytest.mark.parametrize("model", ["fixed", "adaptive"])
def test_stress_is_the_strain_derivative_over_volume(model, loaded):
    energy, positions, cell, result = frozen_energy_function(*loaded(model), make_structure("bulk"))
    volume = abs(float(torch.linalg.det(cell)))
    numerical = np.zeros((3, 3))
    for a, b in np.ndindex(3, 3):
        strain = torch.zeros(3, 3, dtype=cell.dtype)
        strain[a, b] = STRAIN_STEP
        plus, minus = (
            torch.eye(3, dtype=cell.dtype) + strain,
            torch.eye(3, dtype=cell.dtype) - strain,
        )
        numerical[a, b] = (
            energy(positions @ plus, cell @ plus) - energy(positions @ minus, cell @ minus)
        ) / (2 * STRAIN_STEP)
    numerical = 0.5 * (numerical + numerical.T) / volume
    error = np.abs(result.stress - numerical).max()
    assert error < RTOL * np.abs(numerical).max()
