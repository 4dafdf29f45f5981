"""BucketedCalculator with CUDA graphs ("reduce-overhead") on a GPU."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ase.build import bulk

from cache_worker import cached_cell, run_twice

from fastcalc.plain_torch import plain_torch
from fastcalc.uma import BucketedCalculator

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def copper(repeats, seed, scale=1.0):
    """Rattled fcc Cu; ``scale`` 0.85 raises the neighbours per atom from 42 to 54
    (cutoff 4.5 A), moving the edge count to the next 512-edge bucket."""
    atoms = bulk("Cu", "fcc", a=3.61 * scale, cubic=True).repeat(repeats)
    atoms.rattle(0.02, seed=seed)
    return atoms


def results(calc, atoms):
    atoms = atoms.copy()
    atoms.calc = calc
    return atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()


@pytest.fixture(scope="module")
def calculators(uma_checkpoints):
    path = uma_checkpoints["main"].path
    graphs = BucketedCalculator(path, task_name="omat", device="cuda", bucket_size=512,
                                compile_in_background=False)
    eager = BucketedCalculator(
        path, task_name="omat", device="cuda", bucket_size=512, compile_mode="eager"
    )
    return graphs, eager


def assert_close(ours, expected):
    for a, b in zip(ours, expected):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4 * max(1.0, np.abs(b).max()))


def test_cuda_graphs_match_eager_and_keep_earlier_results(calculators):
    graphs, eager = calculators
    kept = []
    for seed in range(4):
        atoms = copper((2, 2, 2), seed)
        ours = results(graphs, atoms)
        assert_close(ours, results(eager, atoms))
        kept.append((atoms, tuple(np.copy(x) for x in ours), ours))
    for atoms, snapshot, held in kept:  # later replays never overwrite a returned result
        for a, b in zip(held, snapshot):
            np.testing.assert_array_equal(a, b)


def test_cuda_graphs_match_fairchem(calculators, reference_calculator):
    """The compiled float32 calculator on CUDA against fairchem's own calculator (float64,
    CPU, experts not merged) on the same checkpoint, over several geometries."""
    graphs, _ = calculators
    fairchem = reference_calculator("main", "omat")
    for seed in range(3):
        atoms = copper((2, 2, 2), seed)
        assert_close(results(graphs, atoms), results(fairchem, atoms))


def test_buckets_reuse_graphs_without_recompiling(calculators):
    """32 atoms with ~1340 edges (bucket 1536), then ~1730 edges (bucket 2048), and back:
    one more CUDA graph, no compilation."""
    graphs, eager = calculators
    results(graphs, copper((2, 2, 2), 7))
    stats = graphs.compile_stats
    results(graphs, copper((2, 2, 2), 7, scale=0.85))  # same atoms, next edge bucket
    assert graphs.compile_stats["cuda_graphs"] == stats["cuda_graphs"] + 1
    for seed in range(3):  # back and forth, new geometries within each bucket
        for atoms in (copper((2, 2, 2), seed), copper((2, 2, 2), seed, scale=0.85)):
            assert_close(results(graphs, atoms), results(eager, atoms))
    assert graphs.compile_stats == {
        **stats, "compilations": 1, "cuda_graphs": stats["cuda_graphs"] + 1, "recompiles": 0
    }


def test_new_atom_counts_record_graphs_without_compiling(calculators):
    graphs, eager = calculators
    results(graphs, copper((2, 2, 2), 1))
    for repeats in [(1, 1, 1), (2, 1, 1), (3, 2, 2), (3, 3, 3)]:
        atoms = copper(repeats, 2)
        assert_close(results(graphs, atoms), results(eager, atoms))
    assert graphs.compile_stats["compilations"] == 1
    assert graphs.compile_stats["recompiles"] == 0


def test_cuda_graphs_follow_a_composition_change(calculators):
    graphs, eager = calculators
    atoms = copper((2, 2, 2), 3)
    alloy = atoms.copy()
    alloy.numbers[::3] = 79
    for structure in (atoms, alloy, atoms):
        assert_close(results(graphs, structure), results(eager, structure))


def test_experts_stay_in_host_memory_until_a_second_system_and_merge_as_on_the_cpu(
    uma_checkpoints,
):
    """On a GPU, one system's merge leaves the experts in host memory (only merged weights
    on the GPU); a second system moves them to the GPU for later merges. Through both,
    results equal the CPU's in float64."""
    path = uma_checkpoints["main"].path
    options = dict(task_name="omat", dtype="float64", compile_mode="eager", bucket_size=512)
    gpu = BucketedCalculator(path, device="cuda", **options)
    cpu = BucketedCalculator(path, device="cpu", **options)
    atoms = copper((2, 2, 2), 5)
    alloy = atoms.copy()
    alloy.numbers[::3] = 79
    layers = gpu.core.mixed_layers()
    for structure, on_gpu in ((atoms, False), (alloy, True), (atoms, True)):
        for ours, expected in zip(results(gpu, structure), results(cpu, structure)):
            np.testing.assert_allclose(ours, expected, rtol=1e-9, atol=1e-9)
        assert layers and all(layer.experts.is_cuda == on_gpu for layer in layers)
    assert all(layer.weight.is_cuda for layer in layers)


def force_error(forces, reference) -> float:
    """max |F - F_ref| / max |F_ref|."""
    return float(np.abs(forces - reference).max() / np.abs(reference).max())


@pytest.fixture
def global_tf32():
    """torch's global switch to TF32, as a user's script may set it."""
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32 = False


@pytest.fixture(scope="module")
def float64(uma_checkpoints):
    return BucketedCalculator(
        uma_checkpoints["main"].path, task_name="omat", device="cuda", dtype="float64",
        compile_mode="eager",
    )


@pytest.fixture(scope="module")
def tf32(uma_checkpoints):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TF32")
        return BucketedCalculator(
            uma_checkpoints["main"].path, task_name="omat", device="cuda", precision="tf32",
            compile_in_background=False,
        )


def test_float32_stays_ieee_with_torch_global_tf32_on(calculators, float64, tf32, global_tf32):
    """Under the global flag, float32 equals the flag-off result (up to the order of
    atomic additions), within float32 round-off of float64, which TF32 in the network alone
    would exceed."""
    graphs, eager = calculators
    atoms = copper((3, 3, 3), 11)  # a new shape: its CUDA graph is recorded now
    exact = results(float64, atoms)[1]
    with_flag = [results(calc, atoms)[1] for calc in (graphs, eager)]
    assert torch.backends.cuda.matmul.allow_tf32  # the user's setting survives
    torch.backends.cuda.matmul.allow_tf32 = False
    without_flag = results(eager, atoms)[1]
    for forces in with_flag:
        assert force_error(forces, without_flag) < 1e-5
        assert force_error(forces, exact) < 1e-4  # float32 round-off
    assert force_error(results(tf32, atoms)[1], exact) > 1e-4


def test_tf32_forces_stay_within_a_percent_of_float64(float64, tf32):
    for seed, repeats in enumerate([(2, 2, 2), (3, 3, 3), (3, 2, 2)]):
        atoms = copper(repeats, seed)
        forces, exact = results(tf32, atoms)[1], results(float64, atoms)[1]
        assert force_error(forces, exact) < 1e-2, repeats
    assert tf32.compile_stats["recompiles"] == 0


def test_3xtf32_forces_have_float32_accuracy(uma_checkpoints, float64):
    calc = BucketedCalculator(
        uma_checkpoints["main"].path, task_name="omat", device="cuda", precision="3xtf32",
        compile_in_background=False,
    )
    for seed, repeats in enumerate([(2, 2, 2), (3, 3, 3)]):
        atoms = copper(repeats, seed)
        forces, exact = results(calc, atoms)[1], results(float64, atoms)[1]
        assert force_error(forces, exact) < 1e-4, repeats  # float32 round-off
    assert calc.compile_stats["recompiles"] == 0


def test_plain_torch_on_cuda_computes_in_ieee_float32(uma_checkpoints, float64, global_tf32):
    """A process's first, uncompiled calls (plain torch: no custom operators, no Triton
    kernels) stay IEEE float32, even under precision="tf32" with torch's global flag on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TF32")
        calc = BucketedCalculator(uma_checkpoints["main"].path, task_name="omat", device="cuda",
                                  precision="tf32", compile_mode="eager")
    atoms = copper((2, 2, 2), 5)
    with plain_torch():
        forces = results(calc, atoms)[1]
    assert force_error(forces, results(float64, atoms)[1]) < 1e-4  # float32 round-off


def test_per_atom_energies_match_eager_and_sum_to_the_energy(calculators):
    graphs, eager = calculators
    atoms = copper((2, 2, 2), 5)
    atoms.numbers[::4] = 79
    energies = []
    for calc in (graphs, eager):
        copy = atoms.copy()
        copy.calc = calc
        energies.append((copy.get_potential_energies(), copy.get_potential_energy()))
    (ours, total), (expected, _) = energies
    np.testing.assert_allclose(ours, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())
    assert ours.sum() == pytest.approx(total, rel=1e-6)


def test_coincident_atoms_are_no_edge_on_cuda(calculators):
    """Two atoms on one site: the pair has no direction, so no edge (as in fairchem's
    graphs); results stay finite and equal eager's."""
    graphs, eager = calculators
    atoms = copper((2, 2, 2), 6)
    atoms.positions[1] = atoms.positions[0]
    ours = results(graphs, atoms)
    assert all(np.isfinite(x).all() for x in ours)
    assert_close(ours, results(eager, atoms))


def test_evaluate_many_on_cuda_matches_one_at_a_time(calculators):
    """Batched CUDA graphs: each structure's result equals the eager calculator's result
    for it alone; a second batch of another size compiles nothing new."""
    graphs, eager = calculators
    first = [copper((2, 2, 2), seed) for seed in range(3)] + [copper((2, 2, 1), 3)]
    second = [copper((3, 2, 2), seed) for seed in range(5)]
    for structures in (first, second):
        for atoms, result in zip(structures, graphs.evaluate_many(structures)):
            ours = (result["energy"], result["forces"], result["stress"])
            assert_close(ours, results(eager, atoms))
    stats = graphs._batch_runner.stats
    assert stats["compilations"] == 1 and stats["recompiles"] == 0


def test_a_second_process_loads_the_compiled_model_from_the_disk_cache(uma_checkpoints,
                                                                       tmp_path, calculators):
    """Two fresh processes with empty torch caches share only fastcalc's disk cache: the
    first compiles once and stores, the second loads the stored graph without compiling
    and with the first's Triton kernels (carried by the entry), replays CUDA graphs and
    gives the same numbers. Its Triton cache ends up with the first's kernel folders:
    neither inductor's kernels nor fastcalc's edge kernels are compiled again."""
    runs = run_twice(uma_checkpoints["main"].path, tmp_path, task="omat")
    assert runs[0]["stats"]["from_cache"] == 0 and runs[0]["stats"]["compilations"] == 1
    assert runs[1]["stats"]["from_cache"] == 1 and runs[1]["stats"]["compilations"] == 0
    assert runs[1]["stats"]["cuda_graphs"] >= 1
    _, eager = calculators
    expected = results(eager, cached_cell())
    for run in runs:
        assert_close((run["energy"], np.array(run["forces"]), np.array(run["stress"])), expected)
    carried, second = set(runs[0]["kernels"]), set(runs[1]["kernels"])
    first, later = runs[0]["cache_keys"], runs[1]["cache_keys"]
    differ = {name: {field: (first.get(name, {}).get(field), value)
                     for field, value in fields.items() if first.get(name, {}).get(field) != value}
              for name, fields in later.items()}
    assert carried and second == carried, (
        f"the second process compiled Triton kernels again: {sorted(second - carried)}; what "
        f"entered their keys, first process vs second: {differ}")
