"""Generate the deterministic EMT copper data set used to fit the demo models.

Reference: ``ase.calculators.emt.EMT`` (Cu, equilibrium fcc lattice constant ~3.59 A).

Structure kinds (every one in train/validation and in test):

- ``bulk``: fcc cells (27 or 32 atoms) at lattice constants 0.96..1.04 a0, short
  Langevin MD at 300, 800, 1200 K;
- ``strained``: fcc cells (16-32 atoms) with a random strain (normal +-4 %, shear
  +-3 %), MD at a random temperature;
- ``vacancy``: fcc cells with one or two vacancies (25-31 atoms), MD;
- ``surface100`` / ``surface111``: slabs (24 or 32 atoms, pbc=(T,T,F), 6 A of vacuum on
  each side), MD at 300-1200 K;
- ``cluster``: non-periodic clusters (13-55 atoms: icosahedra (13, 55), octahedra (19, 38), a decahedron (39),
  fcc spheres), MD at 300-800 K.

Every structure stores ``info["ref_energy"]`` (eV), ``arrays["ref_forces"]`` (eV/A),
``info["ref_stress"]`` (3x3, eV/A^3, ASE sign convention; NaN for structures that are not
periodic along all three axes) and ``info["kind"]``.

Output (git-ignored): ``scripts/demo/data/{train,val,test}.xyz``. Train and validation
come from seed 0 (a seeded 90/10 split); the held-out test set is generated with seed 1.

Run: ``python scripts/demo/make_dataset.py`` (about 2-4 minutes on one core).
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
from ase import Atoms, units
from ase.build import bulk, fcc100, fcc111
from ase.calculators.emt import EMT
from ase.cluster import Decahedron, Icosahedron, Octahedron
from ase.io import write
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary

A0 = 3.59  # EMT copper equilibrium lattice constant (A)
HERE = pathlib.Path(__file__).resolve().parent
KINDS = ("bulk", "strained", "vacancy", "surface100", "surface111", "cluster")


def _bulk_cell(rng, scale):
    choice = rng.integers(2)
    if choice == 0:
        return bulk("Cu", "fcc", a=A0 * scale, cubic=True) * (2, 2, 2)  # 32 atoms
    return bulk("Cu", "fcc", a=A0 * scale) * (3, 3, 3)  # 27 atoms


def _small_bulk_cell(rng, scale):
    choice = rng.integers(3)
    if choice == 0:
        return bulk("Cu", "fcc", a=A0 * scale, cubic=True) * (2, 2, 2)  # 32
    if choice == 1:
        return bulk("Cu", "fcc", a=A0 * scale) * (3, 3, 3)  # 27
    return bulk("Cu", "fcc", a=A0 * scale, cubic=True) * (2, 2, 1)  # 16


def _random_strain(rng, atoms):
    eps = np.zeros((3, 3))
    eps[np.diag_indices(3)] = rng.uniform(-0.04, 0.04, 3)
    off = rng.uniform(-0.03, 0.03, 3)
    eps[0, 1] = eps[1, 0] = off[0]
    eps[0, 2] = eps[2, 0] = off[1]
    eps[1, 2] = eps[2, 1] = off[2]
    atoms.set_cell(atoms.cell[:] @ (np.eye(3) + eps), scale_atoms=True)
    return atoms


def _slab(rng, kind, scale):
    size = [(2, 2, 6), (4, 2, 4)][rng.integers(2)]  # 24 or 32 atoms
    build = fcc100 if kind == "surface100" else fcc111
    slab = build("Cu", size=size, a=A0 * scale, vacuum=6.0, orthogonal=True)
    slab.pbc = (True, True, False)
    return slab


def _cluster(rng):
    choice = rng.integers(6)
    if choice == 0:
        c = Icosahedron("Cu", 2)  # 13
    elif choice == 1:
        c = Icosahedron("Cu", 3)  # 55
    elif choice == 2:
        c = Octahedron("Cu", 4, 1)  # 38
    elif choice == 3:
        c = Octahedron("Cu", 3, 0)  # 19
    elif choice == 4:
        c = Decahedron("Cu", 3, 2, 0)
    else:
        # a random fcc sphere of 20-40 atoms
        big = bulk("Cu", "fcc", a=A0, cubic=True) * (4, 4, 4)
        centre = big.positions.mean(axis=0) + rng.uniform(-0.5, 0.5, 3)
        d = np.linalg.norm(big.positions - centre, axis=1)
        n = int(rng.integers(20, 41))
        c = big[np.argsort(d)[:n]]
    c = Atoms(c.get_chemical_symbols(), positions=c.positions)
    c.center(vacuum=8.0)
    c.pbc = False
    return c


def _label(atoms, kind):
    """A copy of ``atoms`` with EMT energy, forces and stress stored as plain data."""
    calc = EMT()
    out = Atoms(atoms.numbers, positions=atoms.positions, cell=atoms.cell, pbc=atoms.pbc)
    out.calc = calc
    energy = out.get_potential_energy()
    forces = out.get_forces()
    if all(out.pbc):
        stress = out.get_stress(voigt=False)
    else:
        stress = np.full((3, 3), np.nan)
    out.calc = None
    out.info["ref_energy"] = float(energy)
    out.info["ref_stress"] = stress.reshape(9)
    out.info["kind"] = kind
    out.arrays["ref_forces"] = np.array(forces)
    return out


def _md_snapshots(rng, atoms, temperature, kind, n_snapshots, interval=8, equil=40,
                  timestep=4.0):
    atoms = atoms.copy()
    atoms.calc = EMT()
    atoms.rattle(0.02, seed=int(rng.integers(2**31)))
    # start hotter: half the kinetic energy flows into the potential energy
    MaxwellBoltzmannDistribution(atoms, temperature_K=2 * temperature, rng=rng)
    Stationary(atoms)
    dyn = Langevin(atoms, timestep * units.fs, temperature_K=temperature,
                   friction=0.02 / units.fs, rng=rng)
    dyn.run(equil)
    frames = []
    for _ in range(n_snapshots):
        dyn.run(interval)
        frames.append(_label(atoms, kind))
    return frames


def generate(seed: int, scale_count: float = 1.0) -> list[Atoms]:
    """All structures for one seed; ``scale_count`` scales the number of trajectories."""
    rng = np.random.default_rng(seed)
    frames: list[Atoms] = []
    temps = (300.0, 800.0, 1200.0)

    def n(base):
        return max(1, int(round(base * scale_count)))

    # bulk: lattice constants x temperatures
    for scale in np.linspace(0.96, 1.04, 5):
        for t in temps:
            for _ in range(n(2)):
                s = float(scale) + rng.uniform(-0.005, 0.005)
                frames += _md_snapshots(rng, _bulk_cell(rng, s), t, "bulk", 8)
    # strained cells
    for _ in range(n(40)):
        atoms = _random_strain(rng, _small_bulk_cell(rng, rng.uniform(0.98, 1.02)))
        frames += _md_snapshots(rng, atoms, float(rng.choice(temps)), "strained", 4,
                                interval=6, equil=25)
    # vacancies
    for t in temps:
        for _ in range(n(6)):
            atoms = _bulk_cell(rng, rng.uniform(0.98, 1.02))
            n_vac = int(rng.integers(1, 3))
            del atoms[list(rng.choice(len(atoms), n_vac, replace=False))]
            frames += _md_snapshots(rng, atoms, t, "vacancy", 8)
    # surfaces
    for kind in ("surface100", "surface111"):
        for t in temps:
            for _ in range(n(4)):
                slab = _slab(rng, kind, rng.uniform(0.98, 1.02))
                frames += _md_snapshots(rng, slab, t, kind, 10)
    # clusters
    for t in (300.0, 500.0, 800.0):
        for _ in range(n(6)):
            frames += _md_snapshots(rng, _cluster(rng), t, "cluster", 8)
    return frames


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "data"))
    parser.add_argument("--train-seed", type=int, default=0)
    parser.add_argument("--test-seed", type=int, default=1)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    args = parser.parse_args()

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    frames = generate(args.train_seed)
    rng = np.random.default_rng(1000 + args.train_seed)
    order = rng.permutation(len(frames))
    n_val = int(round(args.val_fraction * len(frames)))
    val = [frames[i] for i in order[:n_val]]
    train = [frames[i] for i in order[n_val:]]
    test = generate(args.test_seed, scale_count=0.34)

    for name, data in (("train", train), ("val", val), ("test", test)):
        write(out / f"{name}.xyz", data, format="extxyz")
        counts = {k: sum(a.info["kind"] == k for a in data) for k in KINDS}
        n_atoms = [len(a) for a in data]
        print(f"{name}: {len(data)} structures, {min(n_atoms)}-{max(n_atoms)} atoms, "
              f"{counts}")


if __name__ == "__main__":
    main()
