"""relax_many: a batched FIRE, checked against ASE's FIRE (and FrechetCellFilter) run one
structure at a time on the same calculator (the Morse test potential, float64)."""

import numpy as np
import pytest
from ase.build import bulk, fcc111
from ase.filters import FrechetCellFilter
from ase.optimize import FIRE
from pair_potential import morse_calculator, with_ase_morse

from fastcalc import InvalidAtomsError, relax_many
from fastcalc.relax import FireParameters, irelax

FMAX = 0.05


def crystal(repeat=(2, 2, 1), seed=1, a=3.6):
    atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat(repeat)
    atoms.rattle(0.1, seed=seed)
    return atoms


def slab(seed=2):
    atoms = fcc111("Cu", (2, 2, 2), vacuum=5.0)  # pbc (T, T, F)
    atoms.rattle(0.1, seed=seed)
    return atoms


def cluster(seed=3):
    """Four atoms in a box, not periodic."""
    atoms = crystal(1, seed)
    atoms.pbc = False
    atoms.center(vacuum=4.0)
    return atoms


def three():
    return [crystal(), slab(), cluster()]


def nan_positions():
    atoms = crystal(1, 4)
    atoms.positions[1] = np.nan
    return atoms


@pytest.fixture(scope="module")
def calc():
    return morse_calculator()


def ase_fire(calc, atoms, cell=False, steps=500, **parameters):
    """``atoms`` relaxed in place by ASE's FIRE; its step count and whether it converged."""
    atoms.calc = calc
    optimizer = FIRE(FrechetCellFilter(atoms) if cell else atoms, logfile=None, **parameters)
    converged = optimizer.run(fmax=FMAX, steps=steps)
    return optimizer.nsteps, converged


def assert_matches_ase(relaxed, atoms, steps, converged):
    assert relaxed.error is None
    assert (relaxed.steps, relaxed.converged) == (steps, converged)
    assert relaxed.energy == pytest.approx(atoms.get_potential_energy(), abs=1e-8)
    np.testing.assert_allclose(relaxed.atoms.positions, atoms.positions, rtol=0, atol=1e-8)
    np.testing.assert_allclose(relaxed.atoms.cell.array, atoms.cell.array, rtol=0, atol=1e-8)
    np.testing.assert_allclose(relaxed.forces, atoms.get_forces(), rtol=0, atol=1e-8)


def assert_same(one, other):
    """The same relaxation, to rounding (the calculator sums pairs in the order its
    neighbour search found them, which depends on what it evaluated before)."""
    assert (one.steps, one.converged, one.error) == (other.steps, other.converged, other.error)
    np.testing.assert_allclose(one.atoms.positions, other.atoms.positions, rtol=0, atol=1e-10)
    assert one.energy == pytest.approx(other.energy, abs=1e-10)


def test_matches_ase_fire_step_for_step(calc):
    structures = three()
    before = [atoms.positions.copy() for atoms in structures]
    results = relax_many(structures, calc, fmax=FMAX, progress=False)
    for relaxed, atoms, positions in zip(results, three(), before):
        assert_matches_ase(relaxed, atoms, *ase_fire(calc, atoms))
        assert relaxed.converged and relaxed.steps > 10
        assert np.linalg.norm(relaxed.forces, axis=1).max() < FMAX
        assert relaxed.stress is not None  # each cell has a volume
    for atoms, positions in zip(structures, before):
        np.testing.assert_array_equal(atoms.positions, positions)  # inputs untouched


def test_fire_parameters_and_step_limit_are_ases(calc):
    parameters = dict(dt=0.05, maxstep=0.1, dtmax=0.5, finc=1.2, fdec=0.6, astart=0.2, fa=0.9,
                      a=0.2)
    fire = FireParameters(nmin=3, **parameters)
    relaxed, = relax_many([crystal()], calc, fmax=FMAX, max_steps=12, fire=fire, progress=False)
    atoms = crystal()
    assert_matches_ase(relaxed, atoms, *ase_fire(calc, atoms, steps=12, Nmin=3, **parameters))
    assert not relaxed.converged and relaxed.steps == 12


def test_cell_relaxation_matches_ase_frechet_cell_filter(calc):
    strained = crystal((2, 1, 1), seed=5, a=3.45)
    strained.cell[0, 1] += 0.3
    relaxed, = relax_many([strained], calc, fmax=FMAX, cell=True, progress=False)
    atoms = strained.copy()
    assert_matches_ase(relaxed, atoms, *ase_fire(calc, atoms, cell=True))
    assert relaxed.converged
    assert relaxed.atoms.cell.volume > strained.cell.volume * 1.05  # the cell grew


def test_a_bad_structure_gets_its_error_and_the_others_relax(calc):
    structures = [crystal(), nan_positions(), cluster()]
    results = relax_many(structures, calc, fmax=FMAX, progress=False)
    failed = results[1]
    assert isinstance(failed.error, InvalidAtomsError) and "NaN" in str(failed.error)
    assert (failed.steps, failed.converged, failed.energy) == (0, False, None)
    for relaxed, atoms in zip(results[::2], structures[::2]):
        atoms = atoms.copy()
        assert_matches_ase(relaxed, atoms, *ase_fire(calc, atoms))


def test_a_structure_that_fails_midway_is_returned_where_it_failed_without_results():
    """A cell that shrinks past the neighbour limit: ASE's FIRE on the same calculator
    stops with the same error at the same geometry."""
    atoms = crystal(1, seed=0, a=4.3)
    (relaxed,) = relax_many([atoms], morse_calculator(max_neighbors=60), fmax=0.01, cell=True,
                            progress=False)
    reference = atoms.copy()
    reference.calc = morse_calculator(max_neighbors=60)
    optimizer = FIRE(FrechetCellFilter(reference), logfile=None)
    with pytest.raises(InvalidAtomsError, match="more than the limit of 60") as raised:
        optimizer.run(fmax=0.01)
    assert relaxed.steps == optimizer.nsteps > 0
    assert str(relaxed.error) == str(raised.value)
    np.testing.assert_allclose(relaxed.atoms.cell.array, reference.cell.array, rtol=0, atol=1e-8)
    np.testing.assert_allclose(relaxed.atoms.positions, reference.positions, rtol=0, atol=1e-8)
    assert (relaxed.energy, relaxed.forces, relaxed.stress) == (None, None, None)
    assert relaxed.atoms.calc is None


def test_a_cell_relaxation_needs_a_cell_with_volume(calc):
    molecule = cluster()
    molecule.cell = [10.0, 10.0, 0.0]
    flat, ok = relax_many([molecule, crystal(1)], calc, fmax=FMAX, cell=True, progress=False)
    assert isinstance(flat.error, InvalidAtomsError) and "cell" in str(flat.error)
    assert flat.steps == 0 and ok.converged


def test_in_flight_batches_stay_within_the_budget_and_match_one_batch(calc, monkeypatch):
    structures = [crystal(1, seed) for seed in range(4)] + [crystal((2, 1, 1), 9), cluster()]
    everything = relax_many(structures, calc, fmax=FMAX, progress=False)
    batches = []
    evaluate_many = calc.evaluate_many

    def spy(batch, **kwargs):
        batches.append([id(atoms) for atoms in batch])
        assert sum(map(len, batch)) <= 12 and kwargs["max_atoms"] == 12
        return evaluate_many(batch, **kwargs)

    monkeypatch.setattr(calc, "evaluate_many", spy)
    limited = relax_many(structures, calc, fmax=FMAX, max_atoms=12, progress=False)
    for one, other in zip(limited, everything):
        assert one.converged
        assert_same(one, other)
    first = set(batches[0])
    assert len(first) < len(structures)
    # a structure joined a batch while one of the first was still relaxing
    assert any(set(batch) & first and set(batch) - first for batch in batches)


def test_irelax_reads_structures_as_places_in_the_batch_free_up(calc):
    read = []

    def stream():
        for seed in range(3):
            read.append(seed)
            yield crystal(1, seed)

    finished = irelax(stream(), calc, fmax=FMAX, max_steps=3, max_atoms=4)
    assert read == []
    index, relaxed = next(finished)
    assert (index, relaxed.steps) == (0, 3)
    assert read == [0, 1]  # the batch of one, and the next one looked at
    assert [index for index, _ in finished] == [1, 2]


def test_max_steps_zero_evaluates_only(calc):
    """No step: the input geometry, with ASE's Morse energy and forces there."""
    relaxed, = relax_many([crystal()], calc, fmax=FMAX, max_steps=0, progress=False)
    assert relaxed.steps == 0 and not relaxed.converged
    np.testing.assert_array_equal(relaxed.atoms.positions, crystal().positions)
    reference = with_ase_morse(crystal())
    assert relaxed.energy == pytest.approx(reference.get_potential_energy(), abs=1e-8)
    np.testing.assert_allclose(relaxed.forces, reference.get_forces(), rtol=0, atol=1e-8)


@pytest.mark.parametrize("option", [dict(fmax=0.0), dict(max_steps=-1), dict(max_atoms=0)])
def test_refuses_meaningless_options(calc, option):
    with pytest.raises(ValueError):
        relax_many([crystal(1)], calc, **option)
