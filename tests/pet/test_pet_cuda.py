"""CompiledPETCalculator on CUDA in float32, compiled with CUDA graphs ("reduce-overhead"):
the same numbers as the eager calculator and as metatomic (float64, CPU) over repeated
calls of several sizes, results that later replays do not overwrite, and graphs reused
when a size comes back."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.stress import voigt_6_to_full_3x3_stress
from torch._dynamo.utils import counters

from cache_worker import cached_cell, run_twice

from fastcalc.bench.upstream import metatomic_calculator
from fastcalc.pet import CompiledPETCalculator
from fastcalc.registry import resolve_model_path

from .support import (
    CHARGED_STATE,
    compile_test_model,
    make_structure,
    upstream_calculator,
    upstream_results,
)

pytestmark = pytest.mark.cuda

FLOAT32_RTOL = 1e-4
# name -> structure; atom buckets 16, 24, 40, 8, 8
SIZES = {
    "bulk": lambda: make_structure("bulk"),
    "bulk x2": lambda: make_structure("bulk").repeat((2, 1, 1)),
    "bulk x4": lambda: make_structure("bulk").repeat((2, 2, 1)),
    "molecule": lambda: make_structure("molecule"),
    "tiny": lambda: make_structure("tiny"),
}


def relative_error(ours, theirs) -> float:
    theirs = np.asarray(theirs)
    return float(np.max(np.abs(np.asarray(ours) - theirs)) / max(np.max(np.abs(theirs)), 1e-12))


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return compile_test_model(tmp_path_factory.mktemp("cuda"))


@pytest.fixture(scope="module")
def compiled(model):
    calculator = CompiledPETCalculator(model.pt, device="cuda", compile_in_background=False)
    assert calculator.compile_mode == "reduce-overhead"
    return calculator


@pytest.fixture(scope="module")
def eager(model):
    return CompiledPETCalculator(model.pt, device="cuda", compile_mode="eager")


def results(calculator, atoms: Atoms, **info) -> dict[str, np.ndarray]:
    atoms = atoms.copy()
    atoms.info.update(info)
    atoms.calc = calculator
    out = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces()}
    if atoms.pbc.all():
        out["stress"] = atoms.get_stress(voigt=False)
    return out


def assert_close(ours: dict, theirs: dict) -> None:
    for key in ours:
        assert relative_error(ours[key], theirs[key]) < FLOAT32_RTOL, key


def upstream(calculator, atoms: Atoms, **state) -> dict[str, np.ndarray]:
    reference = upstream_results(calculator, atoms, **state)
    out = {"energy": reference.energy, "forces": reference.forces}
    if reference.stress is not None:
        out["stress"] = reference.stress
    return out


def test_compiled_matches_eager_and_upstream_over_repeated_sizes(model, compiled, eager):
    metatomic = upstream_calculator(model)
    first = results(compiled, SIZES["bulk"]())
    kept, kept_forces = compiled.results, first["forces"].copy()
    rng = np.random.default_rng(0)
    for repeat in range(3):
        for build in SIZES.values():
            atoms = build()
            atoms.positions += rng.normal(0.0, 0.02, atoms.positions.shape)
            ours = results(compiled, atoms)
            assert_close(ours, results(eager, atoms))
            if repeat == 0:
                assert_close(ours, upstream(metatomic, atoms))
    assert np.array_equal(kept["forces"], kept_forces)
    assert_close({"forces": kept["forces"]}, upstream(metatomic, SIZES["bulk"]()))


def test_returning_to_a_bucket_reuses_its_graph(model, compiled):
    results(compiled, SIZES["bulk"]())
    results(compiled, SIZES["bulk x4"]())
    before, stats = graphs(), compiled.compile_stats
    back = results(compiled, SIZES["bulk"]())
    assert graphs() == before
    assert compiled.compile_stats == stats
    assert stats["compilations"] == 1 and stats["recompiles"] == 0
    assert_close(back, upstream(upstream_calculator(model), SIZES["bulk"]()))


def test_charge_and_spin_need_no_new_graph(model, compiled):
    results(compiled, SIZES["bulk"]())
    before = graphs()
    charged = results(compiled, SIZES["bulk"](), **CHARGED_STATE)
    assert graphs() == before
    assert_close(charged, upstream(upstream_calculator(model), SIZES["bulk"](), **CHARGED_STATE))


@pytest.fixture(scope="module")
def float64(model):
    return CompiledPETCalculator(model.pt, device="cuda", dtype="float64", compile_mode="eager")


@pytest.fixture(scope="module")
def tf32(model):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TF32")
        return CompiledPETCalculator(
            model.pt, device="cuda", precision="tf32", compile_in_background=False
        )


def test_float32_stays_ieee_with_torch_global_tf32_on(compiled, eager, float64, tf32):
    """Under torch's global TF32 flag, float32 equals the flag-off result; TF32 in the
    network alone would move forces beyond float32's round-off."""
    atoms = make_structure("bulk").repeat((3, 1, 1))  # a new shape: recorded now
    exact = results(float64, atoms)["forces"]
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with_flag = [results(calc, atoms)["forces"] for calc in (compiled, eager)]
        assert torch.backends.cuda.matmul.allow_tf32  # the user's setting survives
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    without_flag = results(eager, atoms)["forces"]
    for forces in with_flag:
        assert relative_error(forces, without_flag) < 1e-5
        assert relative_error(forces, exact) < 1e-4  # float32 round-off
    assert relative_error(results(tf32, atoms)["forces"], exact) > 1e-4


def test_tf32_forces_stay_within_a_percent_of_float64(float64, tf32):
    for name, structure in SIZES.items():
        atoms = structure()
        forces, exact = results(tf32, atoms)["forces"], results(float64, atoms)["forces"]
        assert relative_error(forces, exact) < 1e-2, name
    assert tf32.compile_stats["recompiles"] == 0


def test_3xtf32_forces_have_float32_accuracy(model, float64):
    calc = CompiledPETCalculator(
        model.pt, device="cuda", precision="3xtf32", compile_in_background=False
    )
    for name, structure in SIZES.items():
        atoms = structure()
        forces, exact = results(calc, atoms)["forces"], results(float64, atoms)["forces"]
        assert relative_error(forces, exact) < 1e-4, name  # float32 round-off
    assert calc.compile_stats["recompiles"] == 0


def test_evaluate_many_under_cuda_graphs_matches_eager_one_at_a_time(model, compiled, eager):
    """Two batches of different sizes and periodicities through the batched graph: each
    result equals the eager calculator's and metatomic's for that structure alone; one
    compilation."""
    metatomic = upstream_calculator(model)
    first = [SIZES[name]() for name in ("bulk", "molecule", "tiny", "bulk x2")]
    second = [SIZES[name]() for name in ("bulk x4", "bulk", "molecule")]
    for structures in (first, second):
        for atoms, result in zip(structures, compiled.evaluate_many(structures)):
            ours = {"energy": result["energy"], "forces": result["forces"]}
            if atoms.pbc.all():
                ours["stress"] = voigt_6_to_full_3x3_stress(result["stress"])
            assert_close(ours, results(eager, atoms))
            assert_close(ours, upstream(metatomic, atoms))
    stats = compiled._batch_runner.stats
    assert stats["compilations"] == 1 and stats["recompiles"] == 0


def test_a_second_process_loads_the_compiled_model_from_the_disk_cache(tmp_path):
    """Two fresh processes with empty torch caches share only fastcalc's disk cache: the
    first compiles once (its first call's inputs include a view) and stores, the second
    loads the stored graph without compiling (not even a Triton kernel: its Triton cache
    ends up with the first's kernel folders, carried by the entry), replays CUDA graphs
    and gives the same numbers as the eager calculator and metatomic."""
    runs = run_twice("pet-demo-cu", tmp_path)
    assert runs[0]["stats"]["from_cache"] == 0 and runs[0]["stats"]["compilations"] == 1
    assert runs[1]["stats"]["from_cache"] == 1 and runs[1]["stats"]["compilations"] == 0
    assert runs[0]["kernels"] and set(runs[1]["kernels"]) == set(runs[0]["kernels"])
    assert runs[1]["stats"]["cuda_graphs"] >= 1
    eager = CompiledPETCalculator("pet-demo-cu", device="cuda", compile_mode="eager")
    expected = results(eager, cached_cell())
    metatomic = upstream(metatomic_calculator(resolve_model_path("pet-demo-cu"), "cpu"),
                         cached_cell())
    for run in runs:
        for reference in (expected, metatomic):
            assert relative_error(run["forces"], reference["forces"]) < FLOAT32_RTOL
        assert relative_error(run["energy"], expected["energy"]) < FLOAT32_RTOL
        # the demo model's energy of this cell is near zero (0.027 eV): metatomic computes
        # it in float32 too, so compare it absolutely, as tests/test_cli.py does
        assert run["energy"] == pytest.approx(metatomic["energy"], abs=1e-4)


def test_compiling_in_the_background_answers_uncompiled_then_replays_cuda_graphs(
    model, eager, tmp_path
):
    """The default calculator on a GPU with an empty disk cache: calls answer uncompiled
    while another process compiles on the same GPU, then load what it stored and replay
    CUDA graphs, with the eager calculator's and metatomic's numbers throughout."""
    metatomic = upstream_calculator(model)
    calculator = CompiledPETCalculator(model.pt, device="cuda", cache_dir=tmp_path)
    atoms = SIZES["bulk"]()
    first = results(calculator, atoms)
    assert_close(first, results(eager, atoms))
    assert_close(first, upstream(metatomic, atoms))
    assert calculator.compile_stats["building"] == 1
    calculator.wait_for_compilation()
    for name in ("bulk x2", "bulk"):
        structure = SIZES[name]()
        ours = results(calculator, structure)
        assert_close(ours, results(eager, structure))
        assert_close(ours, upstream(metatomic, structure))
    stats = calculator.compile_stats
    assert stats["from_cache"] == 1 and stats["compilations"] == 0 and stats["cuda_graphs"] == 2


def test_with_the_model_stored_the_first_call_answers_uncompiled_then_replays_cuda_graphs(
    model, eager, tmp_path
):
    """A later process's calculator (here a second one) answers before the compiler is
    imported to load the stored model, then replays CUDA graphs of the loaded one."""
    first = CompiledPETCalculator(model.pt, device="cuda", cache_dir=tmp_path,
                                  compile_in_background=False)
    atoms = SIZES["bulk"]()
    results(first, atoms)  # compiles and stores the model
    later = CompiledPETCalculator(model.pt, device="cuda", cache_dir=tmp_path)
    metatomic = upstream_calculator(model)
    answered = results(later, atoms)
    assert_close(answered, results(eager, atoms))
    assert_close(answered, upstream(metatomic, atoms))
    assert later.compile_stats["from_cache"] == 0  # answered uncompiled
    later.wait_for_compilation()
    structure = SIZES["bulk x2"]()
    ours = results(later, structure)
    assert_close(ours, results(eager, structure))
    assert_close(ours, upstream(metatomic, structure))
    stats = later.compile_stats
    assert stats["from_cache"] == 1 and stats["compilations"] == 0 and stats["cuda_graphs"] == 1
