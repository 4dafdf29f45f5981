"""``evaluate_many`` of PET: structures of any size, periodicity, composition, charge and
spin in one batched layout, each result equal to the calculator's own for that structure
alone and to metatomic's batched evaluation of the same exported model (float64, CPU)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.stress import full_3x3_to_voigt_6_stress

import fastcalc.pet.calculator as calculator_module
import fastcalc.pet.layout as layout_module
from fastcalc import InvalidAtomsError
from fastcalc.pet import CompiledPETCalculator, PaddedShape
from fastcalc.testing import deviation, evaluate_alone

from .support import CHARGED_STATE, STRUCTURES, compile_test_model, make_structure, upstream_calculator


def mixed(charged: bool = False) -> list[Atoms]:
    """Bulk, slab, molecule and smaller structures of H, C and O in one list; with
    ``charged``, two of them in other charge and spin states."""
    structures = [make_structure(kind) for kind in STRUCTURES]
    if charged:
        structures[1].info.update(CHARGED_STATE)
        structures[4].info.update(charge=-2, spin=3)
    return structures


def assert_same(batched: dict, single: dict, rtol: float = 1e-10) -> None:
    assert set(batched) == set(single) | {"free_energy"}
    assert batched["free_energy"] == batched["energy"]
    for key, value in single.items():
        np.testing.assert_allclose(batched[key], value, rtol=rtol, atol=rtol, err_msg=key)


@pytest.mark.parametrize("model", ["adaptive", "conditioned", "residual"])
def test_each_result_equals_the_structure_alone(model, eager):
    calc = eager(model)
    structures = mixed(charged=model == "conditioned")
    for batched, atoms in zip(calc.evaluate_many(structures), structures):
        assert_same(batched, evaluate_alone(calc, atoms))


def test_charge_and_spin_are_each_systems_own(eager, reference):
    """The same structure in two states within one batch gets two results, each
    metatomic's for its state."""
    neutral, charged = make_structure("bulk"), make_structure("bulk")
    charged.info.update(CHARGED_STATE)
    results = eager("conditioned").evaluate_many([neutral, charged])
    for result, state in zip(results, (False, True)):
        expected = reference("conditioned", "bulk", charged=state)
        assert deviation(result["energy"], expected.energy) < 1e-9
        assert deviation(result["forces"], expected.forces) < 1e-9
    assert abs(results[0]["energy"] - results[1]["energy"]) > 1e-3  # the states differ


def test_batched_results_are_metatomics(pet_models, eager):
    """metatomic's calculator evaluates the same list as one batch too (its stress only
    when every structure is periodic: the periodic ones are asked again on their own)."""
    upstream = upstream_calculator(pet_models["adaptive"])
    structures = mixed()
    ours = eager("adaptive").evaluate_many(structures)
    periodic = [i for i, atoms in enumerate(structures) if atoms.pbc.all()]
    with torch.jit.optimized_execution(False), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # its stress of zero-volume cells
        theirs = upstream.compute_energy(structures, True, per_atom=True)
        stresses = upstream.compute_energy([structures[i] for i in periodic], True)["stress"]
    for index, result in enumerate(ours):
        assert deviation(result["energy"], theirs["energy"][index]) < 1e-9
        assert deviation(result["forces"], theirs["forces"][index]) < 1e-9
        assert deviation(result["energies"], theirs["energies"][index]) < 1e-9
    for index, stress in zip(periodic, stresses):
        assert deviation(ours[index]["stress"], full_3x3_to_voigt_6_stress(stress)) < 1e-9


def test_a_bad_structure_gets_its_error_and_the_others_are_computed(eager):
    calc = eager("conditioned")
    structures = mixed()
    nan = make_structure("tiny")
    nan.positions[1] = np.nan
    copper = make_structure("tiny")
    copper.numbers[0] = 29
    unknown_state = make_structure("molecule")
    unknown_state.info["charge"] = 4  # the model's tables end at 3
    structures[2:2] = [nan, copper, unknown_state]
    results = calc.evaluate_many(structures)
    assert "NaN" in str(results[2]["error"])
    assert "does not support Cu" in str(results[3]["error"])
    assert "charge 4" in str(results[4]["error"])
    for index in (2, 3, 4):
        assert isinstance(results[index]["error"], InvalidAtomsError)
    for index in (0, 1, 5, 6, 7, 8):
        assert_same(results[index], evaluate_alone(calc, structures[index]))


def test_small_atom_budgets_split_batches_without_changing_results(eager):
    calc = eager("adaptive")
    structures = mixed()
    for whole, split in zip(calc.evaluate_many(structures), calc.evaluate_many(structures, max_atoms=12)):
        assert_same(whole, {key: value for key, value in split.items() if key != "free_energy"})


def test_a_too_narrow_batch_layout_is_widened(eager, monkeypatch):
    """An atom keeping more neighbours than the layout's slots: the batch is redone wider."""
    monkeypatch.setattr(calculator_module, "_batch_shape", lambda a, w, p: PaddedShape(a, 2, p))
    calc = eager("adaptive")
    structures = mixed()
    for batched, atoms in zip(calc.evaluate_many(structures), structures):
        assert_same(batched, evaluate_alone(calc, atoms))


def adaptive_calculator(pet_models) -> CompiledPETCalculator:
    """A new eager float64 calculator: no batch widths remembered from other tests."""
    return CompiledPETCalculator(pet_models["adaptive"].pt, device="cpu", dtype="float64",
                                 compile_mode="eager")


@pytest.fixture
def solves(monkeypatch) -> list[int]:
    """One entry per selection of kept edges (the adaptive cutoffs solved): on the host to
    size a layout, or in the (eager) graph."""
    calls: list[int] = []
    select = layout_module.select_edges
    monkeypatch.setattr(layout_module, "select_edges", lambda *a: calls.append(1) or select(*a))
    return calls


def test_later_batches_skip_the_host_solve_with_the_same_results(pet_models, solves):
    """The first batch's width is solved on the host, then in the graph; the same batch
    again runs at the width the first needed, solved in the graph only."""
    calc = adaptive_calculator(pet_models)
    structures = mixed()
    first = calc.evaluate_many(structures)
    assert len(solves) == 2
    second = calc.evaluate_many(structures)
    assert len(solves) == 3
    for again, once in zip(second, first):
        assert_same(again, {key: value for key, value in once.items() if key != "free_energy"}, 0.0)


def test_a_batch_needing_more_slots_than_the_last_is_run_wider(pet_models):
    calc = adaptive_calculator(pet_models)
    calc.evaluate_many([make_structure("isolated")])
    dense = mixed()
    results = calc.evaluate_many(dense)
    sparse, needed = calc._batch_widths
    assert needed > sparse
    for batched, atoms in zip(results, dense):
        assert_same(batched, evaluate_alone(calc, atoms))


def test_a_sparse_batch_between_dense_ones_keeps_their_width(pet_models, solves):
    """dense (sized on the host, then the graph), sparse (the graph at the dense width),
    dense (the graph, not run again wider)."""
    calc = adaptive_calculator(pet_models)
    dense, sparse = mixed(), [make_structure("isolated")]
    for batch in (dense, sparse, dense):
        calc.evaluate_many(batch)
    assert len(solves) == 4


@pytest.fixture(scope="module")
def compile_model(tmp_path_factory):
    return compile_test_model(tmp_path_factory.mktemp("compiled_batches"))


@pytest.mark.compile
def test_a_compiled_batch_graph_serves_every_batch_shape(compile_model):
    """compile_mode='default': two batches of other sizes, systems, widths and states,
    one compilation, the eager results."""
    compiled, eager = (
        CompiledPETCalculator(compile_model.pt, device="cpu", dtype="float64", compile_mode=mode,
                              cache_dir=False)
        for mode in ("default", "eager")
    )
    structures = {kind: atoms for kind, atoms in zip(STRUCTURES, mixed(charged=True))}
    # 8 and 16 padded atoms (as the single-structure compile test), 4 and 8 systems
    small = [structures["tiny"], structures["single"]]
    large = [structures[kind] for kind in ("molecule", "tiny", "isolated", "single")]
    for batch in (small, large):
        for ours, theirs in zip(compiled.evaluate_many(batch), eager.evaluate_many(batch)):
            assert_same(ours, {key: value for key, value in theirs.items() if key != "free_energy"})
    stats = compiled._batch_runner.stats
    assert (stats["compilations"], stats["recompiles"]) == (1, 0)
