"""TorchCalculator / PotentialCalculator against ASE's own Morse calculator; the shared
conformance checks (bad input, awkward structures, finite differences, agreement with
ASE) run in test_check_calculator.py."""

import numpy as np
import torch
import pytest
from ase import Atoms, units
from ase.build import bulk, fcc111, molecule
from ase.calculators.fd import calculate_numerical_stress
from ase.calculators.calculator import PropertyNotImplementedError
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from ase.md.verlet import VelocityVerlet
from pair_potential import CUTOFF, ase_morse, morse_calculator, morse_energy

from fastcalc import InvalidAtomsError, PotentialCalculator
from fastcalc.calculator import atom_chunks, even_chunks
from fastcalc.calculator import charge_and_spin
from fastcalc.buckets import padding_shift


def reference(atoms: Atoms) -> Atoms:
    atoms = atoms.copy()
    atoms.calc = ase_morse()
    return atoms


def crystal(seed: int = 0) -> Atoms:
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.rattle(0.1, seed=seed)
    return atoms


def test_float32_agrees_with_float64_reference():
    atoms = crystal()
    atoms.calc = morse_calculator(dtype="float32")
    expected = reference(atoms)
    assert atoms.get_potential_energy() == pytest.approx(expected.get_potential_energy(), rel=1e-5)
    np.testing.assert_allclose(atoms.get_forces(), expected.get_forces(), atol=1e-4)
    assert atoms.get_forces().dtype == np.float64


@pytest.mark.filterwarnings("ignore:Use thermalize_momenta")
def test_md_with_skin_and_buckets_tracks_ase():
    atoms = crystal()
    MaxwellBoltzmannDistribution(atoms, temperature_K=600, rng=np.random.default_rng(0))
    calc = morse_calculator(skin=0.3, bucket_size=256)
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


def test_stress_of_a_molecule_without_a_cell_is_not_implemented():
    atoms = molecule("H2O")
    atoms.calc = morse_calculator()
    with pytest.raises(PropertyNotImplementedError, match="linearly independent"):
        atoms.get_stress()
    assert np.isfinite(atoms.get_forces()).all()


def slab() -> Atoms:
    atoms = fcc111("Cu", (2, 2, 3), a=3.6, vacuum=5.0)
    atoms.rattle(0.05, seed=3)
    return atoms


@pytest.mark.parametrize("pbc", [(True, True, False), (True, False, False), (False,) * 3],
                         ids=["slab", "wire", "cluster in a box"])
def test_stress_of_a_cell_that_is_not_fully_periodic_matches_ase(pbc):
    """(1/V) dE/dstrain of the cell as given, as ASE's Morse (analytic) computes it."""
    atoms = slab()
    atoms.pbc = pbc
    atoms.calc = morse_calculator()
    expected = reference(atoms).get_stress()
    assert np.abs(expected).max() > 1e-4
    np.testing.assert_allclose(atoms.get_stress(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pbc", [(True, True, False), (True, False, False)], ids=["slab", "wire"])
def test_stress_of_a_slab_or_wire_matches_finite_differences(pbc):
    atoms = slab()
    atoms.pbc = pbc
    atoms.calc = morse_calculator()
    numerical = calculate_numerical_stress(atoms, 1e-5)
    np.testing.assert_allclose(atoms.get_stress(), numerical, rtol=0, atol=1e-9)


def test_slab_stress_counts_the_vacuum_in_the_volume():
    atoms = slab()
    atoms.calc = morse_calculator()
    stress = atoms.get_stress()
    atoms.cell[2] *= 2.0  # twice the vacuum, same atoms: same energy, half the stress
    np.testing.assert_allclose(atoms.get_stress(), stress / 2, rtol=1e-13, atol=0)


def test_stress_of_a_slab_without_a_vacuum_vector_is_refused():
    atoms = slab()
    forces = morse_calculator().get_forces(atoms)
    atoms.cell[2] = 0.0  # the non-periodic axis has no cell vector: no volume
    atoms.calc = morse_calculator()
    with pytest.raises(PropertyNotImplementedError, match="linearly independent"):
        atoms.get_stress()
    np.testing.assert_allclose(atoms.get_forces(), forces, rtol=0, atol=1e-13)


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype"):
        morse_calculator(dtype="float16")


def test_a_cuda_device_this_machine_lacks_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device='cuda': CUDA is not available here \(.*\); "
                                         r"use device='cpu'"):
        PotentialCalculator(morse_energy, CUTOFF, device="cuda")


def test_a_cuda_device_number_beyond_the_machine_s_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"device='cuda:1': this machine has 1 CUDA device"):
        PotentialCalculator(morse_energy, CUTOFF, device="cuda:1")


@pytest.mark.parametrize(
    "setting", [{"bucket_size": 0}, {"bucket_size": -5}, {"bucket_size": 2.5}, {"max_neighbors": 0}]
)
def test_a_padding_step_or_neighbour_limit_below_one_is_refused_when_built(setting):
    (name, value), = setting.items()
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got {value}"):
        morse_calculator(**setting)


@pytest.mark.parametrize("max_atoms", [0, -1])
def test_evaluate_many_refuses_a_budget_below_one_atom(max_atoms):
    with pytest.raises(ValueError, match=f"max_atoms must be a positive integer, got {max_atoms}"):
        morse_calculator().evaluate_many([crystal()], max_atoms=max_atoms)


def test_a_misspelt_keyword_is_refused_with_the_known_name():
    with pytest.raises(TypeError, match=r"'skinn' \(did you mean 'skin'\?\)"):
        morse_calculator(skinn=1.0)


def test_ase_s_own_keywords_are_still_taken():
    assert morse_calculator(label="morse").label == "morse"


def test_set_refuses_a_change_it_could_not_apply_and_keeps_the_calculator():
    """ASE's set() would record skin=1.0 in parameters while the neighbour list kept its
    own: the settings would lie about the results."""
    calc, atoms = morse_calculator(skin=0.5), crystal()
    atoms.calc = calc
    energy = atoms.get_potential_energy()
    assert calc.set(skin=0.5) == {}
    with pytest.raises(ValueError, match="cannot change skin"):
        calc.set(skin=1.0)
    assert calc.parameters["skin"] == 0.5
    assert atoms.get_potential_energy() == energy


def test_results_do_not_depend_on_the_skin():
    atoms = crystal()
    with_skin, without_skin = morse_calculator(skin=1.0), morse_calculator(skin=0.0)
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
     ({"spin_multiplicity": 2}, (0, 2)), ({"spin_multiplicity": 2, "spin": 2.0}, (0, 2))],
)
def test_charge_and_spin_read_from_info(info, expected):
    assert charge_and_spin(info) == expected


@pytest.mark.parametrize("info", [{"charge": 0.5}, {"spin": "2"}, {"charge": True}])
def test_non_integer_charge_or_spin_is_refused(info):
    with pytest.raises(InvalidAtomsError, match="must be an integer"):
        charge_and_spin(info)


def test_spin_keys_that_disagree_are_refused_and_the_calculator_stays_usable():
    # metatomic's calculator reads spin_multiplicity first, fairchem's only spin: no
    # choice between two different values would match both upstreams
    calc = morse_calculator()
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.info.update(spin_multiplicity=2, spin=5)
    atoms.calc = calc
    with pytest.raises(InvalidAtomsError, match="spin_multiplicity=2 and spin=5"):
        atoms.get_potential_energy()
    del atoms.info["spin"]
    reference = bulk("Cu", "fcc", a=3.6, cubic=True)
    reference.calc = ase_morse()
    assert atoms.get_potential_energy() == pytest.approx(reference.get_potential_energy())


def test_two_threads_sharing_one_calculator_each_get_their_own_results():
    from concurrent.futures import ThreadPoolExecutor

    calc = morse_calculator()
    systems = [bulk("Cu", "fcc", a=a, cubic=True).repeat(2) for a in (3.5, 3.6, 3.7, 3.8)]
    for seed, atoms in enumerate(systems):
        atoms.rattle(0.05, seed=seed)

    def forces(atoms: Atoms) -> np.ndarray:
        atoms = atoms.copy()
        atoms.calc = calc
        return atoms.get_forces()

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(forces, systems * 20))
    for atoms, ours in zip(systems * 20, results):
        expected = atoms.copy()
        expected.calc = ase_morse()
        np.testing.assert_allclose(ours, expected.get_forces(), atol=1e-10)


def test_a_copied_calculator_gives_the_same_results():
    import copy
    import pickle

    atoms = crystal()
    calc = morse_calculator()
    expected = calc.get_forces(atoms)
    for other in (copy.deepcopy(calc), pickle.loads(pickle.dumps(calc))):
        np.testing.assert_array_equal(other.get_forces(atoms), expected)


def thin_cell() -> Atoms:
    """A third cell vector 1e-3 Å out of the plane of the other two."""
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.cell[2] = atoms.cell[0] + atoms.cell[1] + [0, 0, 1e-3]
    return atoms


def dense_box() -> Atoms:
    """5000 atoms in a 10 Å box: 5 atoms/Å³, 60 times copper's density."""
    positions = np.random.default_rng(0).random((5000, 3)) * 10.0
    return Atoms("Cu5000", positions=positions, cell=np.eye(3) * 10.0, pbc=True)


@pytest.mark.parametrize(
    "absurd, cause",
    [(thin_cell, r"nearly degenerate: its heights are 0\.001, 0\.001, 0\.001 Å"),
     (dense_box, r"denser than about 2 atoms/Å³: are the positions and the cell in Å")],
)
def test_absurd_geometries_are_refused_at_once_and_the_calculator_goes_on(absurd, cause):
    """Refused before any search (which would hang or run out of memory), naming the
    estimate, the limit and the cause; the next structure is computed as usual."""
    import time

    calc = morse_calculator()
    atoms = absurd()
    atoms.calc = calc
    start = time.perf_counter()
    with pytest.raises(InvalidAtomsError, match=r"about [\d,]+ neighbours within 6\.22 Å "
                       r"expected per atom .* limit of 4096 \(max_neighbors\); .*" + cause):
        atoms.get_potential_energy()
    assert time.perf_counter() - start < 5.0  # well under a second in practice
    assert calc.neighbors.searches == 0
    good = crystal()
    good.calc = calc
    assert good.get_potential_energy() == pytest.approx(
        reference(good).get_potential_energy(), rel=1e-11)


def test_even_chunks_spread_equal_structures_over_as_many_batches_as_atom_chunks():
    """256 structures of 64 atoms under a 5824-atom limit: atom_chunks cuts 91, 91, 74;
    even_chunks cuts three runs, in order, of 85 or 86."""
    items = list(range(256))
    greedy = [len(run) for run in atom_chunks(items, lambda _: 64, 5824)]
    runs = even_chunks(items, lambda _: 64, 5824)
    assert greedy == [91, 91, 74]
    assert [item for run in runs for item in run] == items
    assert sorted(len(run) for run in runs) == [85, 85, 86]


def test_even_chunks_keep_atom_chunks_runs_where_an_even_spread_breaks_the_budget():
    costs = [1.0, 1.0, 1.0, 3.0]
    runs = even_chunks(list(range(4)), lambda _: 1, 100, costs.__getitem__, budget=3.0)
    assert runs == [[0, 1, 2], [3]]


@pytest.mark.parametrize("make", [crystal, slab, lambda: molecule("CH3CH2OH")],
                         ids=["bulk", "slab", "molecule, zero cell"])
def test_the_padding_shift_made_on_the_host_is_that_of_the_model_s_cell(make):
    """The System's padding shift (made on the host, copied once) equals the one
    pad_edges makes on the device from the cell the model sees (zero vectors replaced)."""
    calc = morse_calculator()
    systems = []
    evaluate = calc.evaluate
    calc.evaluate = lambda system: systems.append(system) or evaluate(system)
    atoms = make()
    atoms.calc = calc
    atoms.get_forces()
    (system,) = systems
    assert torch.equal(system.padding_shift, padding_shift(system.cell, CUTOFF))
    # a padded edge (a self-loop with this shift) lies beyond the cutoff
    offset = system.padding_shift.double().numpy() @ system.cell.double().numpy()
    assert np.linalg.norm(offset) > CUTOFF
