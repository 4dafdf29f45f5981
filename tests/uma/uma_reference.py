"""Test structures for the UMA tests.

The random-weight checkpoints and fairchem's calculator come from
``fastcalc.bench.upstream``; this module stays free of fairchem imports so that the
checkpoint tests can use it in a process where fairchem is blocked.
"""

from __future__ import annotations


def structures() -> dict:
    """Small test systems: bulk alloy, slab, charged molecule, 2-atom cell, and a
    molecule of two atoms farther apart than the cutoff (no edges at all)."""
    from ase import Atoms
    from ase.build import bulk, fcc111, molecule

    alloy = bulk("Cu", "fcc", a=3.6, cubic=True)
    alloy.numbers[1] = 79
    alloy.rattle(0.1, seed=4)
    slab = fcc111("Pt", (2, 2, 3), vacuum=4.0)
    slab.numbers[0] = 8
    slab.rattle(0.05, seed=2)
    mol = molecule("CH3CH2OH")
    mol.rattle(0.05, seed=5)
    mol.info.update(charge=1, spin=2)
    tiny = bulk("Si", "diamond", a=5.43)
    tiny.rattle(0.05, seed=3)
    isolated = Atoms("CO", positions=[[0.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    isolated.info.update(charge=0, spin=1)
    return {
        "bulk": ("omat", alloy),
        "slab": ("oc20", slab),
        "molecule": ("omol", mol),
        "tiny": ("omat", tiny),
        "isolated": ("omol", isolated),
    }
