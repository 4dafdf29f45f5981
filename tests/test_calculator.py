"""TorchCalculator / PotentialCalculator against ASE's own Morse calculator."""

import numpy as np
import pytest
from ase import Atoms, units
from ase.build import bulk, fcc111, molecule
from ase.calculators.calculator import PropertyNotImplementedError
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from ase.md.verlet import VelocityVerlet
from pair_potential import CUTOFF, ase_morse, morse_energy

from fastcalc import InvalidAtomsError, PotentialCalculator
from fastcalc.calculator import charge_and_spin


def morse(**kwargs) -> PotentialCalculator:
    kwargs.setdefault("dtype", "float64")
    return PotentialCalculator(morse_energy, CUTOFF, device="cpu", **kwargs)


def reference(atoms: Atoms) -> Atoms:
    atoms = atoms.copy()
    atoms.calc = ase_morse()
    return atoms


def crystal(seed: int = 0) -> Atoms:
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.rattle(0.1, seed=seed)
    return atoms


def tiny_triclinic() -> Atoms:
    atoms = bulk("Cu", "fcc", a=3.6)
    atoms.set_cell(atoms.cell.array + [[0.1, 0, 0], [0, -0.2, 0.1], [0.3, 0, 0]], scale_atoms=True)
    return atoms.repeat((2, 1, 1))


@pytest.mark.parametrize("make", [crystal, tiny_triclinic], ids=["bulk", "tiny triclinic"])
def test_periodic_energy_forces_stress_match_ase(make):
    atoms = make()
    atoms.calc = morse()
    expected = reference(atoms)
    assert atoms.get_potential_energy() == pytest.approx(expected.get_potential_energy(), rel=1e-12)
    np.testing.assert_allclose(atoms.get_forces(), expected.get_forces(), atol=1e-10)
    np.testing.assert_allclose(atoms.get_stress(), expected.get_stress(), atol=1e-12)


@pytest.mark.parametrize(
    "atoms",
    [molecule("C6H6"), fcc111("Cu", (2, 2, 3), vacuum=5.0)],
    ids=["molecule", "slab"],
)
def test_non_periodic_energy_and_forces_match_ase(atoms):
    atoms.positions *= 1.3
    atoms.calc = morse()
    expected = reference(atoms)
    assert atoms.get_potential_energy() == pytest.approx(expected.get_potential_energy(), rel=1e-12)
    np.testing.assert_allclose(atoms.get_forces(), expected.get_forces(), atol=1e-10)


def test_float32_agrees_with_float64_reference():
    atoms = crystal()
    atoms.calc = morse(dtype="float32")
    expected = reference(atoms)
    assert atoms.get_potential_energy() == pytest.approx(expected.get_potential_energy(), rel=1e-5)
    np.testing.assert_allclose(atoms.get_forces(), expected.get_forces(), atol=1e-4)
    assert atoms.get_forces().dtype == np.float64


@pytest.mark.filterwarnings("ignore:Use thermalize_momenta")
def test_md_with_skin_and_buckets_tracks_ase():
    atoms = crystal()
    MaxwellBoltzmannDistribution(atoms, temperature_K=600, rng=np.random.default_rng(0))
    calc = morse(skin=0.3, bucket_size=256)
    atoms.calc = calc
    dyn = VelocityVerlet(atoms, timestep=4 * units.fs)
    for _ in range(30):
        dyn.run(1)
        expected = reference(atoms)
        assert atoms.get_potential_energy() == pytest.approx(
            expected.get_potential_energy(), rel=1e-11)
        np.testing.assert_allclose(atoms.get_forces(), expected.get_forces(), atol=1e-9)
        np.testing.assert_allclose(atoms.get_stress(), expected.get_stress(), atol=1e-11)
    assert 1 < calc.neighbors.searches < 30


class CountingMorse(PotentialCalculator):
    def __init__(self):
        super().__init__(morse_energy, CUTOFF, device="cpu", dtype="float64")
        self.evaluations = 0

    def evaluate(self, *args):
        self.evaluations += 1
        return super().evaluate(*args)


def test_results_are_cached_until_atoms_or_charge_or_spin_change():
    atoms = crystal()
    atoms.calc = calc = CountingMorse()
    atoms.get_potential_energy()
    atoms.get_forces()
    atoms.get_stress()
    assert calc.evaluations == 1
    atoms.info["charge"] = 1
    atoms.get_forces()
    assert calc.evaluations == 2
    atoms.info["spin"] = 2
    atoms.get_forces()
    assert calc.evaluations == 3
    atoms.positions[0, 0] += 0.01
    atoms.get_forces()
    assert calc.evaluations == 4


def test_stress_of_a_non_periodic_system_is_not_implemented():
    atoms = molecule("H2O")
    atoms.calc = morse()
    with pytest.raises(PropertyNotImplementedError, match="periodic along all three axes"):
        atoms.get_stress()
    assert np.isfinite(atoms.get_forces()).all()


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype"):
        morse(dtype="float16")


def nan_positions():
    atoms = crystal()
    atoms.positions[5, 1] = np.nan
    return atoms


def zero_periodic_vector():
    atoms = crystal()
    atoms.cell[2] = 0.0
    return atoms


def wrong_units():
    atoms = crystal()
    atoms.positions *= 0.1
    atoms.cell *= 0.1
    return atoms


BAD = {
    "NaN position": (nan_positions, "atoms \\[5\\] are NaN or infinite"),
    "zero periodic cell vector": (zero_periodic_vector, "periodic cell vectors \\(abc\\) are zero"),
    "empty": (Atoms, "empty"),
    "unsupported element": (lambda: Atoms("CuAu", positions=[[0, 0, 0], [0, 0, 2.5]]),
                            "does not support Au; it supports Cu"),
    "neighbour overflow": (wrong_units, "neighbours within .* are the positions in Å"),
}


def checked_morse():
    return morse(supported_numbers=[29], max_neighbors=500)


def assert_refused(calc, name: str) -> None:
    make, message = BAD[name]
    bad = make()
    bad.calc = calc
    with pytest.raises(InvalidAtomsError, match=message):
        bad.get_forces()


@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_a_clear_error_and_the_calculator_still_works(name):
    calc = checked_morse()
    assert_refused(calc, name)
    good = crystal()
    good.calc = calc
    np.testing.assert_allclose(good.get_forces(), reference(good).get_forces(), atol=1e-10)


@pytest.mark.parametrize("name", BAD)
def test_bad_input_after_good_input_is_still_refused(name):
    calc = checked_morse()
    good = crystal()
    good.calc = calc
    good.get_forces()
    assert_refused(calc, name)


def test_results_do_not_depend_on_the_skin():
    atoms = crystal()
    with_skin, without_skin = morse(skin=1.0), morse(skin=0.0)
    rng = np.random.default_rng(2)
    for _ in range(4):
        atoms.positions += rng.uniform(-0.05, 0.05, atoms.positions.shape)
        with_skin.calculate(atoms, ["energy", "forces", "stress"])
        without_skin.calculate(atoms, ["energy", "forces", "stress"])
        for key in ("energy", "forces", "stress"):
            np.testing.assert_allclose(with_skin.results[key], without_skin.results[key],
                                       rtol=0, atol=1e-12)
    assert with_skin.neighbors.searches == 1 and without_skin.neighbors.searches == 4


@pytest.mark.parametrize(
    "info, expected",
    [({}, (0, 1)), ({"charge": -1, "spin": 3}, (-1, 3)), ({"charge": 2.0}, (2, 1)),
     ({"spin_multiplicity": 2, "spin": 5}, (0, 2))],
)
def test_charge_and_spin_read_from_info(info, expected):
    assert charge_and_spin(info) == expected


@pytest.mark.parametrize("info", [{"charge": 0.5}, {"spin": "2"}, {"charge": True}])
def test_non_integer_charge_or_spin_is_refused(info):
    with pytest.raises(InvalidAtomsError, match="must be an integer"):
        charge_and_spin(info)
