"""Surface energies of copper's (111), (100) and (110) faces with the bundled UMA demo
model, the three slabs relaxed together by `relax_many`, next to ASE's EMT (the data the
demo model was fitted to) relaxed one slab at a time with ASE's own FIRE.

gamma = (E_slab - N e_bulk) / (2 A), with e_bulk the energy per atom of bulk copper at
each model's own lattice constant, and A the area of the slab's cell face.
Run: python examples/surface_energies.py [layers]
"""

import sys

from ase import Atoms, units
from ase.build import bulk, fcc100, fcc110, fcc111
from ase.calculators.calculator import Calculator
from ase.calculators.emt import EMT
from ase.filters import FrechetCellFilter
from ase.optimize import FIRE

from fastcalc import BucketedCalculator, relax_many

FACES = {"111": fcc111, "100": fcc100, "110": fcc110}
J_PER_M2 = units.J / units.m**2  # one J/m² in ASE's eV/Å²
FMAX = 0.01  # eV/Å


def bulk_reference(calc: Calculator) -> tuple[float, float]:
    """Lattice constant (Å) and energy per atom (eV) of fcc copper relaxed with ``calc``."""
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.calc = calc
    FIRE(FrechetCellFilter(atoms), logfile=None).run(fmax=1e-4, steps=300)
    return atoms.cell.lengths()[0], atoms.get_potential_energy() / len(atoms)


def slabs(a: float, layers: int) -> dict[str, Atoms]:
    """2x2 slabs of ``layers`` layers for each face, 8 Å of vacuum on each side."""
    return {face: build("Cu", size=(2, 2, layers), a=a, vacuum=8.0, periodic=True)
            for face, build in FACES.items()}


def surface_energy(slab: Atoms, energy: float, per_atom: float) -> float:
    """gamma in J/m² of a slab with two equal faces."""
    return (energy - len(slab) * per_atom) / (2 * slab.cell.area(2)) / J_PER_M2


def main(layers: int = 5) -> None:
    calc = BucketedCalculator("uma-demo-cu")
    a, per_atom = bulk_reference(calc)
    relaxed = relax_many(list(slabs(a, layers).values()), calc, fmax=FMAX, progress=False)
    a_emt, per_atom_emt = bulk_reference(EMT())
    print(f"lattice constant: demo model {a:.3f} Å, EMT {a_emt:.3f} Å")
    print("face  gamma demo model (steps)  gamma EMT (steps), J/m²")
    for (face, slab), result in zip(slabs(a_emt, layers).items(), relaxed):
        if not result.converged:
            raise RuntimeError(f"Cu({face}) did not relax: {result.error or 'out of steps'}")
        slab.calc = EMT()
        optimizer = FIRE(slab, logfile=None)
        optimizer.run(fmax=FMAX, steps=500)
        ours = surface_energy(result.atoms, result.atoms.get_potential_energy(), per_atom)
        emt = surface_energy(slab, slab.get_potential_energy(), per_atom_emt)
        print(f"({face})  {ours:.3f} ({result.steps})  {emt:.3f} ({optimizer.nsteps})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
