"""fastcalc.testing.check_calculator: passes a correct calculator and names what is wrong
with a broken one (each broken one is the Morse potential with one fault)."""

import numpy as np
import pytest
from ase.calculators.morse import MorsePotential
from pair_potential import CUTOFF, EPSILON, R0, RCUT1, RCUT2, RHO0, ase_morse, morse_calculator

from fastcalc import InvalidAtomsError, PotentialCalculator
from fastcalc.testing import GROUPS, Tolerances, check_calculator, structures

COPPER = [29]


def checked_morse(**kwargs) -> PotentialCalculator:
    return morse_calculator(supported_numbers=COPPER, max_neighbors=500, **kwargs)


def only(*groups: str) -> list[str]:
    return [group for group in GROUPS if group not in groups]


def failed(report) -> list[str]:
    return [check.name for check in report.with_status("failed")]


class Faulty(PotentialCalculator):
    """The Morse potential, with ``fault(results, atoms)`` applied to its results."""

    def __init__(self, fault):
        super().__init__(
            checked_morse().energy_fn, CUTOFF, device="cpu", dtype="float64",
            supported_numbers=COPPER,
        )
        self.fault = fault

    def calculate(self, atoms=None, properties=("energy",), system_changes=()):
        super().calculate(atoms, properties, system_changes)
        self.fault(self.results, self.atoms)


def test_the_morse_calculator_passes_every_check_against_ase():
    report = check_calculator(checked_morse(), ase_morse())
    assert report.with_status("failed") == []
    assert report.with_status("skipped") == []
    ran = {check.name.split(":")[0] for check in report.checks}
    assert ran == set(GROUPS)


def test_float32_passes_with_float32_tolerances():
    tolerances = Tolerances(same=1e-4, reference=1e-4, finite_difference=1e-2, step=1e-2)
    report = check_calculator(checked_morse(dtype="float32"), ase_morse(), tolerances=tolerances)
    assert report.with_status("failed") == []


def test_a_failure_raises_naming_the_check_and_the_deviation():
    def scaled_forces(results, atoms):
        results["forces"] = results["forces"] * 1.01

    with pytest.raises(AssertionError, match=r"finite differences: forces \[slab\]: forces "
                       r"deviates by 1\.0e-02"):
        check_calculator(Faulty(scaled_forces), skip=only("finite differences"))


def test_stress_of_the_wrong_sign_fails_only_the_stress_checks():
    def flipped_stress(results, atoms):
        if "stress" in results:
            results["stress"] = -results["stress"]

    report = check_calculator(Faulty(flipped_stress), ase_morse(), raise_on_failure=False)
    assert failed(report) == [
        "finite differences: stress [tiny triclinic cell]",
        "reference: agrees [crystal]",
        "reference: agrees [tiny triclinic cell]",
        "reference: agrees [atoms outside the cell]",
    ]


def test_forces_that_do_not_sum_to_zero_fail():
    def pushed(results, atoms):
        results["forces"] = results["forces"] + [0.0, 0.0, 0.1]

    report = check_calculator(Faulty(pushed), skip=only("structures"), raise_on_failure=False)
    assert failed(report) == [f"structures: forces sum to zero [{label}]"
                              for label in structures(COPPER)]


def test_a_result_that_depends_on_the_absolute_position_fails_the_translations():
    def field(results, atoms):
        results["energy"] += 0.1 * atoms.positions[:, 0].sum()

    report = check_calculator(Faulty(field), skip=only("translations"), raise_on_failure=False)
    assert "translations: all atoms translated [cluster]" in failed(report)
    assert "translations: one atom moved by a lattice vector [crystal]" in failed(report)


def test_a_charge_that_is_neither_refused_nor_ignored_fails():
    def charged(results, atoms):
        results["energy"] += float(atoms.info.get("charge", 0))

    report = check_calculator(Faulty(charged), skip=only("bad input"), raise_on_failure=False)
    # fastcalc's base refuses a non-integer charge for every model; a million is an integer
    assert failed(report) == [
        "bad input: a charge of a million is refused or ignored (ignored)",
    ]


def test_a_different_reference_fails_every_reference_check():
    other = MorsePotential(epsilon=1.1 * EPSILON, rho0=RHO0, r0=R0, rcut1=RCUT1, rcut2=RCUT2)
    report = check_calculator(checked_morse(), other, skip=only("reference"),
                              raise_on_failure=False)
    alone = "lone atom"  # no neighbour: zero energy for any epsilon
    assert failed(report) == [f"reference: agrees [{label}]" for label in structures(COPPER)
                              if label != alone]


def test_what_the_reference_cannot_compute_is_reported_as_skipped():
    class PeriodicOnly(MorsePotential):
        def calculate(self, atoms=None, properties=("energy",), system_changes=()):
            if not atoms.pbc.all():
                raise NotImplementedError("periodic systems only")
            super().calculate(atoms, properties, system_changes)

    report = check_calculator(checked_morse(), PeriodicOnly(epsilon=EPSILON, rho0=RHO0, r0=R0,
                              rcut1=RCUT1, rcut2=RCUT2), skip=only("reference"))
    skipped = {check.name: check.detail for check in report.with_status("skipped")
               if check.name.startswith("reference")}
    assert set(skipped) == {"reference: agrees [slab]", "reference: agrees [cluster]",
                            "reference: agrees [lone atom]"}
    assert all("periodic systems only" in detail for detail in skipped.values())


class Refusing(PotentialCalculator):
    """The Morse potential, refusing structures of ``size`` atoms with InvalidAtomsError."""

    def __init__(self, size):
        super().__init__(checked_morse().energy_fn, CUTOFF, device="cpu", dtype="float64",
                         supported_numbers=COPPER)
        self.size = size

    def calculate(self, atoms=None, properties=("energy",), system_changes=()):
        if len(atoms) == self.size:
            raise InvalidAtomsError(f"{self.size} atoms are not for me")
        super().calculate(atoms, properties, system_changes)


def test_a_lone_atom_may_be_refused_but_no_other_structure():
    """As fairchem's UMA refuses one atom without periodic boundaries: its checks are
    skipped, with the reason; refusing the cluster (6 atoms) fails its checks."""
    checks = only("structures", "reference")
    report = check_calculator(Refusing(1), ase_morse(), skip=checks, raise_on_failure=False)
    assert failed(report) == []
    assert {check.name: check.detail for check in report.with_status("skipped")
            if not check.name.endswith(": all")} == {
        name: "the calculator refuses it: 1 atoms are not for me"
        for name in ("structures: finite results [lone atom]",
                     "structures: forces sum to zero [lone atom]",
                     "reference: agrees [lone atom]")
    }
    report = check_calculator(Refusing(6), ase_morse(), skip=checks, raise_on_failure=False)
    assert failed(report) == [
        "structures: finite results [cluster]",
        "structures: forces sum to zero [cluster]",
        "reference: agrees [cluster]",
    ]


def test_any_ase_calculator_can_be_checked_without_the_bad_input_group():
    report = check_calculator(ase_morse(), numbers=COPPER, skip=["bad input"])
    assert report.with_status("failed") == []
    assert [str(check) for check in report.with_status("skipped")] == [
        "SKIPPED bad input: all: skipped by the caller",
        "SKIPPED reference: all: no reference calculator given",
    ]


class Rethrowing(PotentialCalculator):
    """The Morse potential, raising ``error(message)`` instead of InvalidAtomsError."""

    def __init__(self, error):
        super().__init__(checked_morse().energy_fn, CUTOFF, device="cpu", dtype="float64",
                         supported_numbers=COPPER, max_neighbors=500)
        self.error = error

    def calculate(self, atoms=None, properties=("energy",), system_changes=()):
        try:
            super().calculate(atoms, properties, system_changes)
        except InvalidAtomsError as error:
            raise self.error(str(error)) from error


#: Refusals expected of the Morse potential: NaN, infinite, zero cell, degenerate cell, empty,
#: element, neighbours, and the non-integer charge and spin (refused by fastcalc's base).
BAD_INPUTS = 9


def test_bad_input_refused_with_another_error_fails():
    report = check_calculator(Rethrowing(RuntimeError), skip=only("bad input"),
                              raise_on_failure=False)
    refusals = report.with_status("failed")
    assert len(refusals) == BAD_INPUTS
    assert all(check.detail.startswith("raised RuntimeError") for check in refusals)


def test_a_refusal_that_does_not_name_the_problem_fails():
    report = check_calculator(Rethrowing(lambda message: InvalidAtomsError("bad input")),
                              skip=only("bad input"), raise_on_failure=False)
    assert len(failed(report)) == BAD_INPUTS
    assert all("the message does not say" in check.detail for check in report.checks
               if check.status == "failed")


def test_unknown_groups_are_refused():
    with pytest.raises(ValueError, match="unknown groups \\['reference checks'\\]"):
        check_calculator(checked_morse(), skip=["reference checks"])


def test_numbers_are_needed_when_the_calculator_does_not_list_them():
    with pytest.raises(ValueError, match="pass numbers"):
        check_calculator(ase_morse())


def test_the_structures_are_awkward():
    shapes = structures(COPPER)
    assert shapes["slab"].pbc.tolist() == [True, True, False]
    tiny = shapes["tiny triclinic cell"].cell
    assert max(tiny.lengths()) < CUTOFF and not np.allclose(tiny.angles(), 90)
    outside = shapes["atoms outside the cell"].get_scaled_positions(wrap=False)
    assert ((outside < 0) | (outside >= 1)).any(axis=1).all()
    assert not shapes["cluster"].pbc.any() and len(shapes["lone atom"]) == 1
