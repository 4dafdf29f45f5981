"""Relax the cell and positions of strained copper with the bundled UMA demo model.

Needs stress: ASE's FrechetCellFilter lets the optimiser move the cell too.
Run: python examples/cell_relaxation.py [max_steps]
"""

import sys

from ase.build import bulk
from ase.filters import FrechetCellFilter
from ase.optimize import FIRE

from fastcalc import BucketedCalculator


def main(max_steps: int = 200) -> None:
    atoms = bulk("Cu", "fcc", a=3.75, cubic=True).repeat(2)  # 4 % too large
    atoms.rattle(0.05, seed=0)
    atoms.calc = BucketedCalculator("uma-demo-cu", compile_mode="eager")
    start = atoms.cell.lengths()[0] / 2
    FIRE(FrechetCellFilter(atoms), logfile=None).run(fmax=0.01, steps=max_steps)
    stress = abs(atoms.get_stress()).max()
    print(f"lattice constant {start:.3f} -> {atoms.cell.lengths()[0] / 2:.3f} Å, "
          f"max |stress| {stress:.2e} eV/Å³, max |force| {abs(atoms.get_forces()).max():.3f} eV/Å")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
