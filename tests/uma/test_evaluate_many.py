"""``evaluate_many``: many structures in few batched graphs, each result equal to the
calculator's own result for that structure alone (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk, fcc111

import fastcalc.calculator as calculator_module
from fastcalc.calculator import BATCH_MEMORY_SHARE, InvalidAtomsError
from fastcalc.neighbors import estimate_crowding
from fastcalc.testing import deviation, evaluate, evaluate_alone
from fastcalc.uma import BucketedCalculator


def copper(repeats, seed, gold=False):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(repeats)
    if gold:
        atoms.numbers[::3] = 79
    atoms.rattle(0.08, seed=seed)
    return atoms


def slab(seed):
    atoms = fcc111("Cu", (2, 2, 3), vacuum=4.0)  # pbc (T, T, F), a cell with a volume
    atoms.rattle(0.05, seed=seed)
    return atoms


def mixed():
    """Mixed sizes and periodicities, two compositions (so two groups), in mixed order."""
    wire = copper((1, 1, 3), 7)
    wire.pbc = (False, False, True)
    molecule = copper((1, 1, 1), 8)
    molecule.pbc = False
    molecule.cell = np.zeros((3, 3))  # no cell: no stress
    return [copper((2, 2, 2), 1), copper((1, 1, 1), 2), slab(3), copper((2, 1, 1), 4, gold=True),
            wire, copper((2, 2, 1), 5), molecule, copper((1, 2, 1), 6, gold=True)]


def assert_same(batched: dict, single: dict) -> None:
    assert set(single) <= set(batched)
    assert "stress" in batched if "stress" in single else "stress" not in batched
    for key, value in single.items():
        np.testing.assert_allclose(batched[key], value, rtol=1e-10, atol=1e-10, err_msg=key)


@pytest.fixture(scope="module")
def calc(uma_checkpoints):
    return BucketedCalculator(uma_checkpoints["main"].path, task_name="omat", dtype="float64",
                              device="cpu", compile_mode="eager", bucket_size=64)


def test_each_result_equals_the_structure_alone(calc):
    structures = mixed()
    for batched, atoms in zip(calc.evaluate_many(structures), structures):
        assert_same(batched, evaluate_alone(calc, atoms))


def test_batched_results_are_fairchems(calc, reference_calculator):
    """The same structures through fairchem's calculator on the same weights (float64)."""
    structures = mixed()
    reference = reference_calculator("main", "omat")
    for batched, atoms in zip(calc.evaluate_many(structures), structures):
        theirs = evaluate(reference, atoms, stress="stress" in batched)
        assert deviation(batched["energy"], theirs.energy) < 1e-8
        assert deviation(batched["forces"], theirs.forces) < 1e-8
        if "stress" in batched:
            assert deviation(batched["stress"], theirs.stress) < 1e-8


def test_small_atom_budgets_split_batches_without_changing_results(calc):
    structures = mixed()
    whole = calc.evaluate_many(structures)
    split = calc.evaluate_many(structures, max_atoms=20)
    for a, b in zip(whole, split):
        assert set(a) == set(b)
        assert_same(a, b)


def test_on_a_gpu_batches_stay_within_their_share_of_the_free_memory(calc, monkeypatch):
    """With free memory pretended (a GPU's, so that the batch share is 2.1 structures'
    worth), 5 equal structures run in 3 batches of at most 2, and the results do not
    change."""
    structures = [copper((2, 1, 1), seed) for seed in range(5)]
    whole = calc.evaluate_many(structures)
    need = calc.memory_estimate(len(structures[0]), estimate_crowding(
        structures[0].positions, structures[0].cell.array, structures[0].pbc, calc.cutoff
    ).neighbors)
    monkeypatch.setattr(calculator_module, "free_memory", lambda device: 2.1 * need / BATCH_MEMORY_SHARE)
    batches = []
    evaluate_batch = calc.evaluate_batch
    monkeypatch.setattr(calc, "evaluate_batch", lambda system: batches.append(
        len(system.cell)) or evaluate_batch(system))
    for a, b in zip(whole, calc.evaluate_many(structures)):
        assert_same(a, b)
    assert batches == [2, 1, 2]


def test_a_batch_out_of_gpu_memory_is_evaluated_again_in_halves(calc, monkeypatch):
    """A batch of more than two structures runs out of memory: its halves run instead
    (recursively), and every result equals the structure's own."""
    structures = [copper((2, 1, 1), seed) for seed in range(5)]
    batches = []
    evaluate_batch = calc.evaluate_batch

    def scarce(system):
        if len(system.cell) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (pretended)")
        batches.append(len(system.cell))
        return evaluate_batch(system)

    monkeypatch.setattr(calc, "evaluate_batch", scarce)
    for batched, atoms in zip(calc.evaluate_many(structures), structures):
        assert_same(batched, evaluate_alone(calc, atoms))
    assert batches == [2, 1, 2]


def test_a_structure_alone_out_of_gpu_memory_gets_that_error(calc, monkeypatch):
    def scarce(system):
        raise torch.OutOfMemoryError("CUDA out of memory (pretended)")

    monkeypatch.setattr(calc, "evaluate_batch", scarce)
    results = calc.evaluate_many([copper((1, 1, 1), 1), copper((2, 1, 1), 2)])
    assert all(isinstance(r["error"], torch.OutOfMemoryError) for r in results)


def test_a_bad_structure_gets_its_error_and_the_others_are_computed(calc):
    structures = mixed()
    nan = copper((1, 1, 1), 9)
    nan.positions[2] = np.nan
    crowded = copper((1, 1, 1), 10)
    crowded.positions[:] = crowded.positions[:1]  # four atoms on one spot: refused
    crowded.positions[1:] += 1e-3
    structures[2:2] = [nan, crowded]
    results = calc.evaluate_many(structures)
    assert isinstance(results[2]["error"], InvalidAtomsError)
    assert "NaN" in str(results[2]["error"])
    for index in (0, 1, 4, 5):
        assert_same(results[index], evaluate_alone(calc, structures[index]))


def test_the_calculators_own_results_are_untouched(calc):
    atoms = copper((1, 1, 1), 11)
    atoms.calc = calc
    energy = atoms.get_potential_energy()
    calc.evaluate_many(mixed())
    assert calc.results["energy"] == energy and atoms.get_potential_energy() == energy


def test_a_compiled_batch_graph_serves_every_batch_shape(uma_checkpoints, calc):
    """compile_mode='default': batches of one and of several structures, one compilation,
    the same results as eager."""
    compiled = BucketedCalculator(uma_checkpoints["main"].path, task_name="omat",
                                  dtype="float64", device="cpu", compile_mode="default",
                                  bucket_size=64, compile_in_background=False)
    # every batch above 8 atoms: on CPU only, inductor turns an (N, 1) x (1, C) product
    # with N + C <= 32 into a broadcast guarded on N, which a batch of 8 atoms would fail
    structures = [s for s in mixed() if len(s) > 4]
    for chunk in (structures[:1], structures):
        for ours, atoms in zip(compiled.evaluate_many(chunk), chunk):
            assert_same(ours, evaluate_alone(calc, atoms))
    assert compiled._batch_runner.stats["compilations"] == 1
    assert compiled._batch_runner.stats["recompiles"] == 0


def test_fairchems_neighbour_limit_applies_per_structure_in_a_batch(uma_checkpoints):
    """The variant checkpoint keeps few neighbours per atom (fairchem's limit): a batch of
    crowded copper cells gives each the result it gets alone."""
    limited = BucketedCalculator(uma_checkpoints["variant"].path, task_name="omat",
                                 dtype="float64", device="cpu", compile_mode="eager",
                                 bucket_size=64)
    structures = [copper((2, 1, 1), seed) for seed in range(3)]
    assert limited.core.max_neighbors < 40  # far fewer than the ~78 within the cutoff
    for batched, atoms in zip(limited.evaluate_many(structures), structures):
        assert_same(batched, evaluate_alone(limited, atoms))
