"""The changes a calculator sees between calls: those of ASE's own ``compare_atoms`` on
the same pairs of Atoms, plus ``"info"`` for charge and spin."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.calculators.calculator import compare_atoms

from fastcalc.changes import system_changes


def base() -> Atoms:
    atoms = bulk("Cu", cubic=True).repeat((2, 1, 1))
    atoms.rattle(0.05, seed=1)
    return atoms


def changed(how) -> Atoms:
    atoms = base()
    how(atoms)
    return atoms


EDITS = {
    "nothing": lambda atoms: None,
    "one position": lambda atoms: atoms.positions.__setitem__((0, 0), 1.0),
    "a position within tol": lambda atoms: atoms.positions.__setitem__(
        (0, 0), atoms.positions[0, 0] + 1e-16),  # near the origin: a different float
    "a NaN position": lambda atoms: atoms.positions.__setitem__((1, 2), np.nan),
    "the cell": lambda atoms: atoms.set_cell(atoms.cell * 1.01),
    "pbc": lambda atoms: atoms.set_pbc([True, True, False]),
    "an element": lambda atoms: atoms.numbers.__setitem__(0, 79),
    "one atom fewer": lambda atoms: atoms.pop(),
    "magnetic moments added": lambda atoms: atoms.set_initial_magnetic_moments([1.0] * 8),
    "charges added": lambda atoms: atoms.set_initial_charges([0.1] * 8),
    "momenta added (not compared)": lambda atoms: atoms.set_momenta(np.ones((8, 3))),
    "tags (not compared)": lambda atoms: atoms.set_tags(np.arange(8)),
}


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("ignored", [(), ("positions", "initial_magmoms")])
def test_the_changes_are_those_ase_finds(edit, ignored):
    old, new = base(), changed(EDITS[edit])
    expected = compare_atoms(old, new, tol=1e-15, excluded_properties=set(ignored))
    ours = system_changes(old, new, 1e-15, ignored)
    assert sorted(ours) == sorted(expected) and len(ours) == len(set(ours))


def test_a_calculator_never_called_sees_everything_changed():
    assert sorted(system_changes(None, base(), 1e-15)) == sorted(compare_atoms(None, base()))


def test_charge_and_spin_changes_are_info_changes():
    old = base()
    for key, value in (("charge", 1), ("spin", 3), ("spin_multiplicity", 2)):
        new = base()
        new.info[key] = value
        assert system_changes(old, new, 1e-15) == ["info"]
    new = base()
    new.info["label"] = "another"
    assert system_changes(old, new, 1e-15) == []
