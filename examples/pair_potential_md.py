"""NVE molecular dynamics of copper with a Morse pair potential written in torch.

Shows the generic path: any torch energy function of (positions, cell, numbers, edges)
becomes an ASE calculator with neighbor lists, a Verlet skin and edge buckets.
Run: python examples/pair_potential_md.py [steps]
"""

import sys

import numpy as np
import torch
from ase import units
from ase.build import bulk
from ase.md.verlet import VelocityVerlet

from fastcalc import PotentialCalculator
from fastcalc.geometry import edge_vectors

EPSILON, RHO0, R0, CUTOFF = 0.35, 4.2, 2.55, 6.0


def morse(positions, cell, numbers, edges):
    """Morse pair energy, shifted so that it and its slope vanish at the cutoff."""
    r = edge_vectors(positions, cell, edges.edge_index, edges.unit_shifts).norm(dim=1)
    r = torch.where(edges.edge_mask, r, CUTOFF).clamp(max=CUTOFF)
    e, e_cut = torch.exp(RHO0 * (1 - r / R0)), np.exp(RHO0 * (1 - CUTOFF / R0))
    slope_cut = -2 * EPSILON * RHO0 / R0 * e_cut * (e_cut - 1)
    pair = EPSILON * (e * (e - 2) - e_cut * (e_cut - 2)) - (r - CUTOFF) * slope_cut
    return 0.5 * pair.sum()


def main(steps: int = 100) -> None:
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(3)
    atoms.rattle(0.05, seed=0)
    atoms.calc = PotentialCalculator(morse, CUTOFF, dtype="float64")
    atoms.set_momenta(np.zeros_like(atoms.positions))
    start = atoms.get_total_energy()
    VelocityVerlet(atoms, timestep=2 * units.fs).run(steps)
    drift = (atoms.get_total_energy() - start) / len(atoms)
    print(f"{steps} steps on {atoms.calc.device}: energy drift {drift * 1e3:.3f} meV/atom, "
          f"{atoms.calc.neighbors.searches} neighbor searches")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
