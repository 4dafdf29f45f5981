"""A Morse pair potential written as a fastcalc energy function, for tests.

Its parameters and functional form are those of ``ase.calculators.morse.MorsePotential``
(pair energy times a quintic smooth cutoff), which serves as the independent reference:
ASE computes forces and stress analytically, fastcalc by autograd.
"""

import torch
from ase.calculators.morse import MorsePotential

from fastcalc import PotentialCalculator
from fastcalc.buckets import PaddedEdges
from fastcalc.geometry import edge_vectors

EPSILON, RHO0, R0, RCUT1, RCUT2 = 0.4, 5.0, 2.6, 1.5, 2.2
CUTOFF = RCUT2 * R0


def ase_morse() -> MorsePotential:
    return MorsePotential(epsilon=EPSILON, rho0=RHO0, r0=R0, rcut1=RCUT1, rcut2=RCUT2)


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
