"""A conformance check for ASE calculators: :func:`check_calculator`.

It uses only ASE's calculator interface, so it applies to every fastcalc calculator and
to any ASE calculator that returns energy and forces (and stress): bad input is refused
with :class:`fastcalc.InvalidAtomsError` without harming the next call; awkward
structures (a slab, a triclinic cell smaller than the cutoff, atoms outside the cell, a
cluster, a lone atom) give finite, translation-invariant results; forces and stress are
central differences of the energy (:mod:`ase.calculators.fd`); and, given a
``reference`` calculator, everything agrees with it. The structures are small and
built with fixed seeds, so the check is fast and deterministic in a user's test suite.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from ase import Atoms
from ase.build import bulk, fcc111
from ase.calculators.calculator import BaseCalculator
from ase.calculators.fd import calculate_numerical_forces, calculate_numerical_stress
from ase.data import chemical_symbols

from .calculator import InvalidAtomsError

__all__ = [
    "GROUPS", "MAY_BE_REFUSED", "Check", "Report", "Results", "Tolerances", "check_calculator",
    "deviation", "deviations", "evaluate", "evaluate_alone", "structures",
]

#: The groups of checks, in the order they run; ``skip`` names any of them.
GROUPS = ("bad input", "structures", "translations", "finite differences", "reference")
#: Structures a calculator may refuse with :class:`InvalidAtomsError` (their checks are then
#: skipped, with the reason): fairchem's UMA refuses one atom without periodic boundaries
#: unless the checkpoint declares it supported.
MAY_BE_REFUSED = ("lone atom",)
#: Deviations are relative to the largest expected component, or to this (eV, eV/Å,
#: eV/Å³) when that is smaller, so that results near zero are compared absolutely.
FLOOR = 1e-2
Status = Literal["passed", "failed", "skipped"]


@dataclass(frozen=True)
class Tolerances:
    """Largest allowed relative deviations (see :data:`FLOOR`); the defaults suit float64.

    ``same``: results that only round-off may change (translations, wrapping, the same
    input again, the sum of the forces). ``reference``: agreement with the reference
    calculator. ``finite_difference``: forces and stress against central differences
    of the energy with displacements (Å) and strains of ``step``. For float32 about
    ``same=1e-4, reference=1e-4, finite_difference=1e-2, step=1e-2``.
    """

    same: float = 1e-10
    reference: float = 1e-8
    finite_difference: float = 1e-5
    step: float = 1e-4


@dataclass(frozen=True)
class Check:
    """One check: its name, ``"passed"``, ``"failed"`` or ``"skipped"``, and the detail
    (the deviation found, the error raised, or why it was skipped)."""

    name: str
    status: Status
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.status.upper():7} {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Report:
    """Every check :func:`check_calculator` ran or skipped, in order."""

    checks: tuple[Check, ...]

    def with_status(self, status: Status) -> list[Check]:
        """The checks whose status is ``status``, in order."""
        return [check for check in self.checks if check.status == status]

    def __str__(self) -> str:
        return "\n".join(map(str, self.checks))


@dataclass(frozen=True)
class Results:
    """Energy (eV), forces (eV/Å) and Voigt stress (eV/Å³, or None) of one structure."""

    energy: float
    forces: np.ndarray
    stress: np.ndarray | None


def wants_stress(calc: BaseCalculator, atoms: Atoms) -> bool:
    """Stress is asked for on fully periodic systems, of calculators that implement it."""
    return bool(atoms.pbc.all()) and "stress" in calc.implemented_properties


def evaluate(calc: BaseCalculator, atoms: Atoms, stress: bool | None = None) -> Results:
    """``calc``'s results for a copy of ``atoms``, copied out of the calculator;
    ``stress=None`` asks for stress where :func:`wants_stress` says so."""
    atoms = atoms.copy()
    atoms.calc = calc
    energy = float(atoms.get_potential_energy())
    forces = np.array(atoms.get_forces(), dtype=float)
    if stress is None:
        stress = wants_stress(calc, atoms)
    return Results(energy, forces, np.array(atoms.get_stress(), dtype=float) if stress else None)


def evaluate_alone(calc: BaseCalculator, atoms: Atoms) -> dict[str, np.ndarray | float]:
    """``calc``'s results for a copy of ``atoms`` under the names ``evaluate_many`` uses:
    energy, forces, per-atom energies and, for a cell with a volume, stress (Voigt)."""
    atoms = atoms.copy()
    atoms.calc = calc
    out = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces(),
           "energies": atoms.get_potential_energies()}
    if atoms.cell.rank == 3:
        out["stress"] = atoms.get_stress()
    return out


def deviation(actual: np.ndarray | float, expected: np.ndarray | float) -> float:
    """Largest deviation relative to the largest expected component (or :data:`FLOOR`)."""
    expected = np.asarray(expected, dtype=float)
    largest = np.abs(np.asarray(actual, dtype=float) - expected).max(initial=0.0)
    return float(largest / max(np.abs(expected).max(initial=0.0), FLOOR))


def deviations(actual: Results, expected: Results) -> dict[str, float]:
    """:func:`deviation` of energy, forces and (where both have it) stress."""
    errors = {
        "energy": deviation(actual.energy, expected.energy),
        "forces": deviation(actual.forces, expected.forces),
    }
    if actual.stress is not None and expected.stress is not None:
        errors["stress"] = deviation(actual.stress, expected.stress)
    return errors


def structures(numbers: Sequence[int], bond: float = 2.5) -> dict[str, Atoms]:
    """The shared awkward structures: fcc-like arrangements of ``numbers`` (in turn),
    nearest neighbours about ``bond`` Å apart, rattled with fixed seeds."""

    def made_of(atoms: Atoms, seed: int) -> Atoms:
        atoms.numbers = [numbers[i % len(numbers)] for i in range(len(atoms))]
        atoms.rattle(0.05, seed=seed)
        return atoms

    crystal = made_of(bulk("Cu", "fcc", a=bond * np.sqrt(2), cubic=True), 1)
    sheared = bond * np.array([[0.0, 1, 1], [1, 0, 1], [1, 1, 0]]) + np.diag([0.1, -0.2, 0.15])
    sheared[2, 0] += 0.3
    tiny = made_of(Atoms("X2", scaled_positions=[[0, 0, 0], [0.5] * 3], cell=sheared, pbc=True), 2)
    slab = made_of(fcc111("Cu", (2, 2, 2), a=bond * np.sqrt(2), vacuum=5.0), 3)
    cluster = made_of(Atoms(positions=bulk("Cu", "fcc", a=bond * np.sqrt(2), cubic=True)
                            .repeat((2, 1, 1)).positions[:6]), 4)
    outside = crystal.copy()  # most atoms outside the cell, none wrapped
    outside.positions += outside.cell.array.T @ [-0.6, 1.45, -1.3]
    return {
        "crystal": crystal,
        "tiny triclinic cell": tiny,
        "slab": slab,
        "cluster": cluster,
        "lone atom": made_of(Atoms(positions=[[0.0, 0.0, 0.0]]), 5),
        "atoms outside the cell": outside,
    }


def _bad_structures(
    good: Atoms, supported: Collection[int] | None
) -> list[tuple[str, Atoms | str, str]]:
    """(what is wrong, the Atoms or why there is none, a pattern its error must match),
    all but the empty Atoms made from the periodic ``good``."""
    nan, infinite, zero_cell, flat_cell, unsupported = (good.copy() for _ in range(5))
    nan.positions[1, 2] = np.nan
    infinite.positions[0, 0] = np.inf
    zero_cell.cell[2] = 0.0
    flat_cell.cell[2] = flat_cell.cell[0] + flat_cell.cell[1]
    squeezed = good.repeat(2)  # positions in nm taken as Å: thousands of neighbours
    squeezed.set_cell(squeezed.cell * 0.1, scale_atoms=True)
    missing = sorted(set(range(1, len(chemical_symbols))) - set(supported or ()))
    symbol = chemical_symbols[missing[0]] if supported is not None and missing else ""
    if symbol:
        unsupported.numbers[0] = missing[0]
    else:
        unsupported = ("the calculator does not list supported_numbers" if supported is None
                       else "the calculator supports every element")
    return [
        ("a NaN position", nan, r"\bnan\b"),
        ("an infinite position", infinite, r"infinite|\binf\b"),
        ("a zero cell vector with pbc", zero_cell, r"cell"),
        ("linearly dependent cell vectors with pbc", flat_cell, r"cell"),
        ("an empty Atoms", Atoms(), r"empty"),
        (f"an unsupported element {symbol}".rstrip(), unsupported, rf"\b{symbol}\b"),
        ("far too many neighbours", squeezed, r"neighbou?r"),
    ]


#: ``atoms.info`` entries no calculator can use: each must be refused or ignored.
BAD_INFO = (
    ("a non-integer charge", {"charge": 0.5}, r"charge"),
    ("a charge of a million", {"charge": 10**6}, r"charge"),
    ("a negative spin multiplicity", {"spin": -1}, r"spin"),
    ("a non-integer spin multiplicity", {"spin": 1.5}, r"spin"),
)


class _Checker:
    """Runs the checks on one calculator and collects their :class:`Check` records."""

    def __init__(self, calc: BaseCalculator, tolerances: Tolerances) -> None:
        self.calc = calc
        self.tolerances = tolerances
        self.checks: list[Check] = []

    def record(self, name: str, status: Status, detail: str = "") -> None:
        self.checks.append(Check(name, status, detail))

    def run(
        self, check: Callable[..., None], name: str, *args: object, refusable: bool = False
    ) -> None:
        """``check(name, *args)``; an exception it did not expect fails it, except that
        with ``refusable`` an :class:`InvalidAtomsError` skips it."""
        try:
            check(name, *args)
        except Exception as error:  # noqa: BLE001 (a calculator may fail any way: report it)
            if refusable and isinstance(error, InvalidAtomsError):
                self.record(name, "skipped", f"the calculator refuses it: {error}")
            else:
                self.record(name, "failed", f"raised {type(error).__name__}: {error}")

    def within(self, name: str, errors: dict[str, float], tolerance: float) -> None:
        """Pass if every relative deviation in ``errors`` is at most ``tolerance``."""
        what = max(errors, key=lambda key: np.nan_to_num(errors[key], nan=np.inf))
        passed = all(error <= tolerance for error in errors.values())
        self.record(name, "passed" if passed else "failed",
                    f"{what} deviates by {errors[what]:.1e} (relative); tolerance {tolerance:.0e}")

    def agree(self, name: str, actual: Results, expected: Results, tolerance: float) -> None:
        self.within(name, deviations(actual, expected), tolerance)

    def refused(self, name: str, atoms: Atoms, pattern: str, ignorable: Results | None) -> None:
        """Pass if ``atoms`` raises :class:`InvalidAtomsError` matching ``pattern``, or,
        given ``ignorable``, gives those very results."""
        try:
            results = evaluate(self.calc, atoms)
        except InvalidAtomsError as error:
            found = re.search(pattern, str(error), re.IGNORECASE)
            self.record(name, "passed" if found else "failed",
                        str(error) if found else f"the message does not say /{pattern}/: {error}")
            return
        if ignorable is None:
            self.record(name, "failed", "no InvalidAtomsError was raised")
        else:
            self.agree(name + " (ignored)", results, ignorable, self.tolerances.same)

    def unchanged(self, name: str, atoms: Atoms, expected: Results) -> None:
        self.agree(name, evaluate(self.calc, atoms), expected, self.tolerances.same)

    def bad_input(self, good: Atoms) -> None:
        """Each bad input, then ``good`` again (its results unchanged)."""
        expected = evaluate(self.calc, good)
        supported = getattr(self.calc, "supported_numbers", None)
        cases = [(what, atoms, pattern, None)
                 for what, atoms, pattern in _bad_structures(good, supported)]
        for what, info, pattern in BAD_INFO:
            atoms = good.copy()
            atoms.info.update(info)
            cases.append((what, atoms, pattern, expected))
        for what, atoms, pattern, ignorable in cases:
            name = f"bad input: {what} is refused" + (" or ignored" if ignorable else "")
            if isinstance(atoms, str):
                self.record(name, "skipped", atoms)
                continue
            self.run(self.refused, name, atoms, pattern, ignorable)
            self.run(self.unchanged, f"bad input: correct results after {what}", good, expected)

    def finite(self, name: str, atoms: Atoms) -> None:
        results = evaluate(self.calc, atoms)
        values = [results.energy, results.forces]
        values += [] if results.stress is None else [results.stress]
        finite = all(np.isfinite(value).all() for value in values)
        self.record(name, "passed" if finite else "failed",
                    "" if finite else "NaN or infinite results")

    def balanced(self, name: str, atoms: Atoms) -> None:
        forces = evaluate(self.calc, atoms).forces
        total = np.abs(forces.sum(axis=0)).max()
        scale = max(np.abs(forces).max(), FLOOR)
        self.within(name, {"the sum of the forces": total / scale}, self.tolerances.same)

    def moved(self, name: str, atoms: Atoms, moved: Atoms) -> None:
        self.unchanged(name, moved, evaluate(self.calc, atoms))

    def numerical_forces(self, name: str, atoms: Atoms) -> None:
        atoms = atoms.copy()
        atoms.calc = self.calc
        checked = [len(atoms) - 1]  # one atom keeps the check fast
        forces = atoms.get_forces()[checked]
        numerical = calculate_numerical_forces(atoms, self.tolerances.step, checked)
        self.within(name, {"forces": deviation(forces, numerical)},
                    self.tolerances.finite_difference)

    def numerical_stress(self, name: str, atoms: Atoms) -> None:
        atoms = atoms.copy()
        atoms.calc = self.calc
        stress = atoms.get_stress()
        numerical = calculate_numerical_stress(atoms, self.tolerances.step)
        self.within(name, {"stress": deviation(stress, numerical)},
                    self.tolerances.finite_difference)

    def against(self, name: str, reference: BaseCalculator, atoms: Atoms) -> None:
        ours = evaluate(self.calc, atoms)
        try:
            theirs = evaluate(reference, atoms, stress=ours.stress is not None)
        except Exception as error:  # noqa: BLE001 (what the reference cannot do is reported)
            self.record(name, "skipped", f"the reference cannot compute it: "
                        f"{type(error).__name__}: {error}")
            return
        self.agree(name, ours, theirs, self.tolerances.reference)


def _translations(shapes: dict[str, Atoms]) -> list[tuple[str, Atoms, Atoms]]:
    """(name, structure, the same structure moved by a lattice vector or translated)."""
    moves = []
    for label in ("crystal", "tiny triclinic cell", "slab"):
        atoms = shapes[label]
        moved = atoms.copy()
        along = [1, -1, 0] if label == "slab" else [1, -1, 2]  # periodic directions only
        moved.positions[0] += atoms.cell.array.T @ along
        moves.append((f"translations: one atom moved by a lattice vector [{label}]", atoms, moved))
    for label in ("crystal", "slab", "cluster"):
        atoms = shapes[label]
        moved = atoms.copy()
        moved.positions += [0.37, -0.61, 0.23]
        moves.append((f"translations: all atoms translated [{label}]", atoms, moved))
    for label in ("atoms outside the cell", "slab"):
        atoms = shapes[label].copy()
        atoms.positions += atoms.cell.array.T @ [-0.7, 1.4, 0.0]
        wrapped = atoms.copy()
        wrapped.wrap()
        moves.append((f"translations: wrapped positions [{label}]", atoms, wrapped))
    return moves


def check_calculator(
    calc: BaseCalculator,
    reference: BaseCalculator | None = None,
    *,
    numbers: Sequence[int] | None = None,
    bond: float = 2.5,
    tolerances: Tolerances = Tolerances(),
    skip: Collection[str] = (),
    raise_on_failure: bool = True,
) -> Report:
    """Run the conformance checks on ``calc`` through ASE's calculator interface.

    The structures are made of ``numbers`` (atomic numbers, used in turn; default the
    first two of ``calc.supported_numbers``) with neighbours about ``bond`` Å apart.
    The groups of checks (:data:`GROUPS`, any of which ``skip`` leaves out):

    - ``"bad input"``: NaN or infinite positions, a zero or degenerate periodic cell,
      an empty Atoms, an unsupported element and thousands of neighbours raise
      :class:`fastcalc.InvalidAtomsError` naming the problem; charge or spin in
      ``atoms.info`` that no model can use is refused the same way or ignored; after
      each, a good input gives the results it gave before.
    - ``"structures"``: finite results and forces summing to zero on each of
      :func:`structures` (a calculator may refuse those in :data:`MAY_BE_REFUSED` with
      :class:`fastcalc.InvalidAtomsError`: their checks are then skipped).
    - ``"translations"``: moving one atom by a lattice vector, translating all atoms
      and wrapping atoms into the cell leave energy, forces and stress unchanged.
    - ``"finite differences"``: the forces on one atom (tiny triclinic cell, slab,
      cluster) and the stress (tiny triclinic cell) equal central differences of the
      energy (:mod:`ase.calculators.fd`, ASE's sign conventions).
    - ``"reference"``: energy, forces and stress equal ``reference``'s on every
      structure; skipped, with the reason, where the reference raises.

    Stress is asked for only on fully periodic systems, and only when ``calc``
    implements it. Returns the :class:`Report`; with ``raise_on_failure`` an
    ``AssertionError`` listing the failed checks is raised instead if any failed.
    """
    unknown = set(skip) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown groups {sorted(unknown)} in skip; the groups are {GROUPS}")
    if numbers is None:
        supported = getattr(calc, "supported_numbers", None)
        if not supported:
            raise ValueError("pass numbers: the calculator does not list supported_numbers")
        numbers = sorted(supported)[:2]
    shapes = structures(numbers, bond)
    checker = _Checker(calc, tolerances)
    for group in GROUPS:
        if group in skip:
            checker.record(f"{group}: all", "skipped", "skipped by the caller")
        elif group == "bad input":
            checker.run(lambda _, good: checker.bad_input(good), "bad input: the good input",
                        shapes["crystal"])
        elif group == "structures":
            for label, atoms in shapes.items():
                refusable = label in MAY_BE_REFUSED
                checker.run(checker.finite, f"structures: finite results [{label}]", atoms,
                            refusable=refusable)
                checker.run(checker.balanced, f"structures: forces sum to zero [{label}]", atoms,
                            refusable=refusable)
        elif group == "translations":
            for name, atoms, moved in _translations(shapes):
                checker.run(checker.moved, name, atoms, moved)
        elif group == "finite differences":
            for label in ("tiny triclinic cell", "slab", "cluster"):
                atoms = shapes[label]
                checker.run(checker.numerical_forces, f"{group}: forces [{label}]", atoms)
            label = "tiny triclinic cell"  # the most general cell: one stress check suffices
            if wants_stress(calc, shapes[label]):
                checker.run(checker.numerical_stress, f"{group}: stress [{label}]", shapes[label])
        elif reference is None:
            checker.record("reference: all", "skipped", "no reference calculator given")
        else:
            for label, atoms in shapes.items():
                checker.run(checker.against, f"reference: agrees [{label}]", reference, atoms,
                            refusable=label in MAY_BE_REFUSED)
    report = Report(tuple(checker.checks))
    failed = report.with_status("failed")
    if raise_on_failure and failed:
        raise AssertionError(
            f"check_calculator: {len(failed)} of {len(report.checks)} checks failed:\n"
            + "\n".join(map(str, failed))
        )
    return report
