"""fastcalc.screen evaluates or relaxes many structures, appends each result as it finishes,
records a structure it cannot evaluate with its error, and resumes a killed run."""

import os
import re
from functools import partial

import numpy as np
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.io import read, write
from ase.optimize import FIRE

from fastcalc import InvalidAtomsError
from fastcalc.models import load_calculator
from fastcalc.screen import (
    QUEUED_PER_WORKER,
    ScreenSetupError,
    WorkerDiedError,
    screen,
    screen_structure,
)

#: extended XYZ keeps 8 decimals of positions and forces
FORCE_TOL = 2e-7


def copper(repeat, seed, a=3.61):
    atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat(repeat)
    atoms.rattle(0.05, seed=seed)
    return atoms


def cluster():
    atoms = copper(1, seed=3)
    atoms.pbc = False
    atoms.center(vacuum=4.0)
    return atoms


def structures():
    """Four copper structures of 4 to 32 atoms, one of them not periodic."""
    return [copper(1, 0), copper((2, 1, 1), 1, a=3.58), cluster(), copper(2, 2, a=3.64)]


def gold():
    return bulk("Au", "fcc", cubic=True)


def nan_positions():
    atoms = copper(1, 4)
    atoms.positions[2] = np.nan
    return atoms


@pytest.fixture(scope="module")
def calculator():
    """float64: the screen evaluates batches, whose sums round apart from one structure's
    in float32 (1e-6 of the energy), beyond what the comparisons below allow."""
    return load_calculator("pet-demo-cu", device="cpu", dtype="float64")


def by_index(path):
    frames = read(path, ":", format="extxyz")
    indices = [int(frame.info["screen_index"]) for frame in frames]
    assert len(indices) == len(set(indices)), f"an index written twice: {sorted(indices)}"
    return dict(zip(indices, frames))


def assert_results_equal(frame, expected):
    """``frame`` (read back from the output) holds ``expected``'s energy, forces and stress."""
    assert "screen_error" not in frame.info
    assert frame.get_potential_energy() == pytest.approx(expected.get_potential_energy(),
                                                         rel=1e-7)
    np.testing.assert_allclose(frame.get_forces(), expected.get_forces(), rtol=0, atol=FORCE_TOL)
    if expected.pbc.all():
        np.testing.assert_allclose(frame.get_stress(), expected.get_stress(), rtol=1e-6,
                                   atol=1e-8)
    else:
        assert "stress" not in frame.calc.results


def direct(atoms, calculator):
    atoms = atoms.copy()
    atoms.calc = calculator
    return atoms


def test_serial_results_equal_the_calculator_on_each_structure(calculator, tmp_path):
    inputs = structures()
    summary = screen(inputs, lambda: calculator, tmp_path / "out.extxyz", progress=False)
    assert (summary.done, summary.failed, summary.skipped) == (4, 0, 0)
    frames = by_index(tmp_path / "out.extxyz")
    assert sorted(frames) == [0, 1, 2, 3]
    for index, atoms in enumerate(inputs):
        np.testing.assert_allclose(frames[index].positions, atoms.positions, atol=1e-8)
        assert_results_equal(frames[index], direct(atoms, calculator))


def test_serial_evaluation_takes_many_structures_per_model_call(calculator, tmp_path,
                                                               monkeypatch):
    calls = []
    evaluate_many = calculator.evaluate_many
    monkeypatch.setattr(calculator, "evaluate_many",
                        lambda structures: calls.append(len(structures)) or evaluate_many(
                            structures))
    inputs = [*structures(), nan_positions()]
    summary = screen(inputs, lambda: calculator, tmp_path / "out.extxyz", progress=False)
    assert (summary.done, summary.failed) == (4, 1)
    assert calls == [5]
    frames = by_index(tmp_path / "out.extxyz")
    assert "screen_error" in frames[4].info
    for index, atoms in enumerate(inputs[:4]):
        assert_results_equal(frames[index], direct(atoms, calculator))


def test_a_bad_structure_is_recorded_with_its_error_and_the_others_succeed(calculator, tmp_path):
    inputs = [copper(1, 0), gold(), nan_positions(), copper((2, 1, 1), 1)]
    summary = screen(inputs, lambda: calculator, tmp_path / "out.extxyz", progress=False)
    assert (summary.done, summary.failed) == (2, 2)
    frames = by_index(tmp_path / "out.extxyz")
    for index in (1, 2):
        with pytest.raises(InvalidAtomsError) as error:
            direct(inputs[index], calculator).get_potential_energy()
        assert frames[index].info["screen_error"] == str(error.value)
        assert frames[index].calc is None
    for index in (0, 3):
        assert_results_equal(frames[index], direct(inputs[index], calculator))


def test_relax_matches_ases_fire_on_the_same_structure(calculator, tmp_path):
    start = copper((2, 1, 1), 5)
    start.rattle(0.1, seed=6)
    screen([start], lambda: calculator, tmp_path / "out.extxyz", relax=True, fmax=0.05,
           progress=False)
    [frame] = by_index(tmp_path / "out.extxyz").values()
    expected = direct(start, calculator)
    optimizer = FIRE(expected, logfile=None)
    assert optimizer.run(fmax=0.05, steps=500)
    assert frame.info["screen_converged"]
    assert frame.info["screen_steps"] == optimizer.nsteps > 0
    assert np.linalg.norm(frame.get_forces(), axis=1).max() < 0.05
    assert frame.get_potential_energy() == pytest.approx(expected.get_potential_energy(),
                                                         abs=1e-3)


def test_serial_relaxations_run_in_one_batch_and_match_screen_structure(tmp_path, monkeypatch):
    calculator = load_calculator("uma-demo-cu", device="cpu")  # evaluates batches
    inputs = [copper(1, 0), nan_positions(), copper(1, 1)]  # one composition: one graph
    batches = []
    evaluate_many = calculator.evaluate_many

    def spy(structures, **kwargs):
        batches.append(len(structures))
        return evaluate_many(structures, **kwargs)

    monkeypatch.setattr(calculator, "evaluate_many", spy)
    summary = screen(inputs, lambda: calculator, tmp_path / "out.extxyz", relax=True,
                     progress=False)
    monkeypatch.undo()
    assert (summary.done, summary.failed) == (2, 1)
    assert batches[0] == 3 and len(batches) > 1
    frames = by_index(tmp_path / "out.extxyz")
    assert "NaN" in frames[1].info["screen_error"] and frames[1].calc is None
    for index in (0, 2):
        expected = screen_structure(calculator, inputs[index], relax=True)  # ASE's FIRE
        for key in ("screen_steps", "screen_converged"):
            assert frames[index].info[key] == expected.info[key]
        np.testing.assert_allclose(frames[index].positions, expected.positions, atol=1e-5)
        assert frames[index].get_potential_energy() == pytest.approx(  # float32
            expected.get_potential_energy(), abs=1e-6)
        np.testing.assert_allclose(frames[index].get_stress(), expected.get_stress(),
                                   rtol=1e-5, atol=1e-7)


def test_a_relaxation_cut_short_by_max_steps_reports_not_converged(calculator):
    start = copper((2, 1, 1), 5)
    start.rattle(0.1, seed=6)
    result = screen_structure(calculator, start, relax=True, fmax=0.05, max_steps=2)
    assert result.info["screen_steps"] == 2
    assert result.info["screen_converged"] is False


class Interrupted(Exception):
    """Stands for Ctrl-C or a killed worker: the run stops with structures left to do."""


def stopping_after(inputs, count):
    """``inputs``, but the run is interrupted when it asks for structure ``count``."""
    yield from inputs[:count]
    raise Interrupted


def test_an_interrupted_run_resumed_does_each_structure_once(calculator, tmp_path):
    out = tmp_path / "out.extxyz"
    inputs = structures()
    with pytest.raises(Interrupted):
        screen(stopping_after(inputs, 2), lambda: calculator, out, progress=False)
    assert sorted(by_index(out)) == [0, 1]
    with pytest.raises(ScreenSetupError, match="already exists: resume"):
        screen(inputs, lambda: calculator, out, progress=False)
    summary = screen(inputs, lambda: calculator, out, resume=True, progress=False)
    assert (summary.done, summary.failed, summary.skipped) == (2, 0, 2)
    frames = by_index(out)
    assert sorted(frames) == [0, 1, 2, 3]
    for index, atoms in enumerate(inputs):
        assert_results_equal(frames[index], direct(atoms, calculator))


def test_resume_drops_a_half_written_last_frame_and_redoes_it(calculator, tmp_path):
    out = tmp_path / "out.extxyz"
    inputs = structures()[:2]
    screen(inputs[:1], lambda: calculator, out, progress=False)
    written = out.read_bytes()
    partial_frame = tmp_path / "partial.extxyz"
    half = screen_structure(calculator, inputs[1])
    half.info["screen_index"] = 1
    write(partial_frame, half, format="extxyz")
    out.write_bytes(written + partial_frame.read_bytes()[:150])  # killed while writing
    with pytest.warns(UserWarning, match="ends in an incomplete frame"):
        summary = screen(inputs, lambda: calculator, out, resume=True, progress=False)
    assert (summary.done, summary.skipped) == (1, 1)
    assert out.read_bytes().startswith(written)
    frames = by_index(out)
    assert sorted(frames) == [0, 1]
    assert_results_equal(frames[1], direct(inputs[1], calculator))


def test_each_frame_records_what_made_it(tmp_path):
    out = tmp_path / "out.extxyz"
    screen(structures()[:2], EMT, out, relax=True, fmax=0.1, max_steps=3,
           settings={"model": "emt", "task": None}, progress=False)
    for frame in read(out, ":", format="extxyz"):
        made_by = {key: value for key, value in frame.info.items() if key.startswith("screen_")}
        assert made_by == {"screen_index": made_by["screen_index"], "screen_model": "emt",
                           "screen_relax": True, "screen_fmax": 0.1, "screen_max_steps": 3,
                           "screen_steps": made_by["screen_steps"],
                           "screen_converged": made_by["screen_converged"]}


@pytest.mark.parametrize(
    "changed, message",
    [({"settings": {"model": "other"}}, "model emt in the file, other now"),
     ({"fmax": 0.05}, "fmax 0.1 in the file, 0.05 now"),
     ({"relax": False}, "relax True in the file, False now")],
    ids=["model", "fmax", "relax"],
)
def test_a_resume_with_other_settings_is_refused_before_the_model_loads(changed, message,
                                                                       tmp_path):
    def no_model():
        raise AssertionError("the model was loaded")

    out = tmp_path / "out.extxyz"
    settings = {"relax": True, "fmax": 0.1, "max_steps": 3, "settings": {"model": "emt"}}
    screen(structures()[:2], EMT, out, progress=False, **settings)
    written = out.read_bytes()
    with pytest.raises(ScreenSetupError, match=re.escape(f"other settings ({message})")):
        screen(structures(), no_model, out, resume=True, progress=False,
               **{**settings, **changed})
    assert out.read_bytes() == written
    summary = screen(structures(), EMT, out, resume=True, progress=False, **settings)
    assert (summary.done, summary.skipped) == (2, 2)


def test_nothing_is_loaded_or_written_for_a_screen_that_cannot_start(tmp_path):
    def no_model():
        raise AssertionError("the model was loaded")

    with pytest.raises(ScreenSetupError, match=r"use .extxyz or .xyz"):
        screen(structures(), no_model, tmp_path / "out.traj", progress=False)
    with pytest.raises(ScreenSetupError, match="fmax must be positive"):
        screen(structures(), no_model, tmp_path / "out.xyz", relax=True, fmax=0,
               progress=False)
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2)
    yield ray
    ray.shutdown()


def test_two_ray_workers_give_the_serial_results(ray_cluster, tmp_path):
    inputs = [*structures(), gold()]
    # uma-demo-cu loads faster than PET; float64: the serial run evaluates batches
    factory = partial(load_calculator, "uma-demo-cu", device="cpu", dtype="float64")
    summary = screen(inputs, factory, tmp_path / "ray.extxyz", workers=2, progress=False)
    assert (summary.done, summary.failed) == (4, 1)
    screen(inputs, factory, tmp_path / "serial.extxyz", progress=False)
    on_ray, serial = by_index(tmp_path / "ray.extxyz"), by_index(tmp_path / "serial.extxyz")
    assert sorted(on_ray) == sorted(serial) == [0, 1, 2, 3, 4]
    assert on_ray[4].info["screen_error"] == serial[4].info["screen_error"]
    for index in range(4):
        assert_results_equal(on_ray[index], serial[index])


def test_a_ray_worker_evaluates_runs_of_structures_with_a_batching_calculator(ray_cluster,
                                                                              tmp_path):
    """A calculator that evaluates batches gets the structures a worker is sent in one
    ``evaluate_many`` call (here one that reports each call's size as the energy)."""
    def counting_batches():  # defined here, so that Ray sends it to the workers by value
        class CountingBatches(EMT):
            evaluates_batches = True

            def evaluate_many(self, structures):
                return [{"energy": float(len(structures)), "forces": np.zeros((len(a), 3)),
                         "stress": np.zeros(6)} for a in structures]

        return CountingBatches()

    inputs = [*structures(), copper(1, 7), copper((2, 1, 1), 8)]  # 60 atoms: one run
    summary = screen(inputs, counting_batches, tmp_path / "out.extxyz", workers=2,
                     progress=False)
    assert summary.done == 6
    frames = by_index(tmp_path / "out.extxyz")
    assert [frames[index].get_potential_energy() for index in range(6)] == [6.0] * 6


def test_each_ray_worker_is_sent_a_run_before_any_gets_a_second(ray_cluster, tmp_path,
                                                                monkeypatch):
    """Two runs of structures go to two workers, not both to the first (here each
    worker reports its process as the energy)."""
    def reporting_process():  # defined here, so that Ray sends it to the workers by value
        class ReportingProcess(EMT):
            evaluates_batches = True

            def evaluate_many(self, structures):
                return [{"energy": float(os.getpid()), "forces": np.zeros((len(a), 3)),
                         "stress": np.zeros(6)} for a in structures]

        return ReportingProcess()

    monkeypatch.setattr("fastcalc.screen.SCREEN_BATCH_ATOMS", 32)
    inputs = [copper(2, 0), copper(2, 1)]  # 32 atoms each: two runs
    screen(inputs, reporting_process, tmp_path / "out.extxyz", workers=2, progress=False)
    frames = by_index(tmp_path / "out.extxyz")
    processes = {frames[index].get_potential_energy() for index in range(2)}
    assert len(processes) == 2 and os.getpid() not in processes


def test_a_dead_worker_loses_only_what_it_held_and_a_resume_does_that(ray_cluster, tmp_path):
    def crashing_emt():  # defined here, so that Ray sends it to the workers by value
        class Crashing(EMT):
            def calculate(self, atoms=None, *args, **kwargs):
                if atoms.info.get("crash"):
                    os._exit(1)  # the worker process dies, as if killed
                super().calculate(atoms, *args, **kwargs)

        return Crashing()

    inputs = [*structures(), copper(1, 7), copper((2, 1, 1), 8)]
    inputs[2].info["crash"] = True
    out = tmp_path / "out.extxyz"
    with pytest.raises(WorkerDiedError, match="1 of 2 Ray workers died") as died:
        screen(inputs, crashing_emt, out, workers=2, progress=False)
    named = re.search(r"losing structures ([\d, ]+) \(", str(died.value)).group(1)
    lost = {int(number) for number in named.split(", ")}
    assert 2 in lost and len(lost) <= QUEUED_PER_WORKER  # the rest went to the other worker
    assert sorted(by_index(out)) == sorted(set(range(6)) - lost)
    del inputs[2].info["crash"]
    summary = screen(inputs, EMT, out, resume=True, progress=False)
    assert (summary.done, summary.skipped) == (len(lost), 6 - len(lost))
    frames = by_index(out)
    assert sorted(frames) == list(range(6))
    for index, atoms in enumerate(inputs):
        assert_results_equal(frames[index], direct(atoms, EMT()))
