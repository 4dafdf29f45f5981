"""A Morse pair potential written as a fastcalc energy function, for tests.

Its parameters and functional form are those of ``ase.calculators.morse.MorsePotential``
(pair energy times a quintic smooth cutoff), which serves as the independent reference:
ASE computes forces and stress analytically, fastcalc by autograd.
"""

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.morse import MorsePotential

from fastcalc import PotentialCalculator
from fastcalc.buckets import PaddedEdges, pad_edges
from fastcalc.geometry import edge_vectors, energy_forces_stress
from fastcalc.neighbors import neighbor_list

EPSILON, RHO0, R0, RCUT1, RCUT2 = 0.4, 5.0, 2.6, 1.5, 2.2
CUTOFF = RCUT2 * R0


def ase_morse() -> MorsePotential:
    return MorsePotential(epsilon=EPSILON, rho0=RHO0, r0=R0, rcut1=RCUT1, rcut2=RCUT2)


def with_ase_morse(atoms: Atoms) -> Atoms:
    """A copy of ``atoms`` (positions, cell, momenta) with ASE's Morse calculator."""
    copy = atoms.copy()
    copy.calc = ase_morse()
    return copy


def assert_ase_morse(
    energy, forces, stress, atoms, rel: float = 1e-12, atol: float = 1e-10,
    stress_atol: float = 1e-12,
) -> None:
    """``energy``, ``forces`` (N, 3) and ``stress`` (3, 3, (1/V) dE/dstrain) equal ASE's Morse
    calculator's on ``atoms`` (array-likes or tensors): the energy to ``rel``, the forces to
    ``atol`` eV/Å, the stress to ``stress_atol`` eV/Å³."""
    energy, forces, stress = (
        np.asarray(x.detach() if isinstance(x, torch.Tensor) else x)
        for x in (energy, forces, stress)
    )
    reference = with_ase_morse(atoms)
    assert float(energy) == pytest.approx(reference.get_potential_energy(), rel=rel)
    np.testing.assert_allclose(forces, reference.get_forces(), rtol=0, atol=atol)
    voigt = stress[[0, 1, 2, 1, 0, 0], [0, 1, 2, 2, 2, 1]]
    np.testing.assert_allclose(voigt, reference.get_stress(), rtol=0, atol=stress_atol)


def morse_energy(
    positions: torch.Tensor, cell: torch.Tensor, numbers: torch.Tensor, edges: PaddedEdges
) -> torch.Tensor:
    r = edge_vectors(positions, cell, edges.edge_index, edges.unit_shifts).norm(dim=1)
    expf = torch.exp(RHO0 * (1 - r / R0))
    pair = EPSILON * expf * (expf - 2)
    s = (1 - (r - RCUT1 * R0) / ((RCUT2 - RCUT1) * R0)).clamp(0, 1)
    smooth = s**3 * (6 * s**2 - 15 * s + 10)
    return 0.5 * (pair * smooth).sum()


def morse_calculator(**kwargs) -> PotentialCalculator:
    """The Morse potential on fastcalc's machinery (float64 on CPU unless told)."""
    kwargs.setdefault("dtype", "float64")
    return PotentialCalculator(morse_energy, CUTOFF, device="cpu", **kwargs)


def morse_efs(positions, cell, numbers, edge_index, unit_shifts, edge_mask):
    edges = PaddedEdges(edge_index, unit_shifts, edge_mask)
    return energy_forces_stress(
        lambda x, c: morse_energy(x, c, numbers, edges), positions, cell, compute_stress=True
    )


def crystal(repeats):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(repeats)
    atoms.rattle(0.1, seed=sum(repeats))
    return atoms


def graph_inputs(atoms, bucket_size=64):
    positions, cell = torch.tensor(atoms.positions), torch.tensor(atoms.cell.array)
    edge_index, shifts = neighbor_list(positions, cell, torch.tensor(atoms.pbc), CUTOFF)
    edges = pad_edges(edge_index, shifts, cell, CUTOFF, bucket_size)
    return (positions, cell, torch.tensor(atoms.numbers), edges.edge_index, edges.unit_shifts,
            edges.edge_mask)
