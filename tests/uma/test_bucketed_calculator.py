"""BucketedCalculator: the shared conformance checks against fairchem, task choice,
fairchem's charge/spin rules, padding."""

from __future__ import annotations

import copy
import pickle
import time

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.fd import calculate_numerical_stress
from ase.neighborlist import neighbor_list
from test_against_fairchem import RTOL
from uma_reference import structures

from fastcalc.bench.upstream import build_checkpoint, default_backbone, fairchem_calculator
from fastcalc.buckets import EDGE_FRACTION, padded_size
from fastcalc.calculator import InvalidAtomsError
from fastcalc.testing import check_calculator, deviation, deviations, evaluate
from fastcalc.uma import BucketedCalculator, UMACore, UnknownTaskError, load_checkpoint

SMALL = dict(num_layers=1, sphere_channels=8, hidden_channels=8, edge_channels=8,
             num_distance_basis=8)


@pytest.fixture(scope="module")
def consistent(tmp_path_factory):
    """A small checkpoint whose stress is the strain derivative of its energy (the shared
    fixtures' stress normaliser differs on purpose) and which declares single atoms
    supported, so that fairchem evaluates a lone atom too."""
    path = tmp_path_factory.mktemp("consistent") / "consistent.pt"
    build_checkpoint(path, default_backbone(**SMALL), "UMA-S-1.2", seed=3, consistent_stress=True,
                     supports_single_atoms=True)
    return path


def test_passes_check_calculator_against_fairchem(consistent):
    """Eager float64 on the consistent checkpoint: nothing skipped."""
    calc = BucketedCalculator(consistent, task_name="omat", dtype="float64", device="cpu")
    report = check_calculator(calc, fairchem_calculator(consistent, "omat"), numbers=[29, 79])
    assert report.with_status("skipped") == []


def test_check_calculator_skips_the_lone_atom_that_fairchem_refuses(uma_checkpoints):
    """Without supports_single_atoms both refuse one atom without periodic boundaries."""
    path = uma_checkpoints["main"].path
    calc = BucketedCalculator(path, task_name="omat", dtype="float64", device="cpu")
    report = check_calculator(calc, numbers=[29], skip=["bad input", "translations",
                                                        "finite differences", "reference"])
    assert report.with_status("failed") == []
    skipped = [check for check in report.with_status("skipped") if "lone atom" in check.name]
    assert len(skipped) == 2 and all("refuses it" in check.detail for check in skipped)


def test_task_name_required_when_ambiguous(uma_checkpoints):
    path = uma_checkpoints["main"].path
    with pytest.raises(ValueError, match=r"task_name.*'oc20', 'omat', 'omol'"):
        BucketedCalculator(path, device="cpu", compile_mode="eager")
    with pytest.raises(UnknownTaskError, match="omcat"):
        BucketedCalculator(path, task_name="omcat", device="cpu", compile_mode="eager")


def test_single_task_and_core_defaults(uma_checkpoints):
    checkpoint = load_checkpoint(uma_checkpoints["main"].path)
    checkpoint.tasks = {"omat": checkpoint.tasks["omat"]}
    assert BucketedCalculator(checkpoint, device="cpu", compile_mode="eager").task_name == "omat"
    core = UMACore(load_checkpoint(uma_checkpoints["main"].path), "oc20")
    calc = BucketedCalculator(core, device="cpu", compile_mode="eager")
    assert calc.task_name == "oc20"
    assert calc.supported_numbers == frozenset(range(1, 100))  # max_num_elements = 100


@pytest.mark.parametrize(
    "info, message",
    [({"charge": 101}, r"charge.*-100 to 100"), ({"spin": "2"}, r"spin.*integer")],
)
def test_fairchem_charge_and_spin_rules(our_calculator, info, message):
    """Just outside fairchem's range, and a string, are refused (check_calculator covers
    the generic cases and the calculator's state afterwards)."""
    bad = structures()["molecule"][1]
    bad.info.update(info)
    bad.calc = our_calculator("main", "omol")
    with pytest.raises(InvalidAtomsError, match=message):
        bad.get_potential_energy()


def test_omol_defaults_charge_zero_spin_one(our_calculator, reference_calculator):
    mol = structures()["molecule"][1]
    mol.info.clear()
    explicit = mol.copy()
    explicit.info.update(charge=0, spin=1)
    ours = evaluate(our_calculator("main", "omol"), mol).energy
    assert deviation(ours, evaluate(reference_calculator("main", "omol"), explicit).energy) < RTOL


def test_bucket_size_changes_nothing(uma_checkpoints, our_calculator):
    """Padded edges (many or none) leave energy, forces and stress unchanged."""
    task, atoms = structures()["bulk"]
    small = evaluate(our_calculator("main", task), atoms)  # bucket_size 64
    for bucket_size in (1, 4096):
        calc = BucketedCalculator(
            uma_checkpoints["main"].path, task_name=task, dtype="float64", device="cpu",
            compile_mode="eager", bucket_size=bucket_size,
        )
        other = evaluate(calc, atoms)
        for key in ("energy", "forces", "stress"):
            np.testing.assert_allclose(getattr(other, key), getattr(small, key), rtol=1e-12,
                                       atol=1e-12)


def test_compile_modes_have_one_meaning_on_cpu(uma_checkpoints):
    path = uma_checkpoints["main"].path
    assert BucketedCalculator(path, task_name="omat", device="cpu").compile_mode == "eager"
    with pytest.warns(UserWarning, match="needs CUDA; using 'default'"):
        calc = BucketedCalculator(
            path, task_name="omat", device="cpu", compile_mode="reduce-overhead"
        )
    assert calc.compile_mode == "default"
    with pytest.raises(ValueError, match="compile_mode must be one of 'auto', 'eager'"):
        BucketedCalculator(path, task_name="omat", device="cpu", compile_mode="max-autotune")


def test_compile_mode_none_still_means_eager_with_a_deprecation_warning(uma_checkpoints):
    with pytest.warns(DeprecationWarning, match="compile_mode='eager'"):
        calc = BucketedCalculator(
            uma_checkpoints["main"].path, task_name="omat", device="cpu", compile_mode=None
        )
    assert calc.compile_mode == "eager"


def test_todict_records_the_settings_that_differ_from_the_defaults(uma_checkpoints):
    path = uma_checkpoints["main"].path
    calc = BucketedCalculator(path, task_name="omat", device="cpu", bucket_size=64, skin=0.3)
    assert calc.todict() == {
        "checkpoint": str(path), "task_name": "omat", "device": "cpu", "bucket_size": 64,
        "skin": 0.3,
    }


def test_after_a_task_switch_todict_records_the_new_task(uma_checkpoints):
    """A trajectory written after set_task names the task that computed its results, as
    one written by a calculator built for that task does."""
    path = uma_checkpoints["main"].path
    calc = BucketedCalculator(path, task_name="omat", device="cpu")
    calc.set_task("omol")
    assert calc.todict() == BucketedCalculator(path, task_name="omol", device="cpu").todict()


def test_the_bundled_demo_model_refuses_elements_it_was_not_fitted_on():
    gold = bulk("Au", "fcc", a=4.08)
    gold.calc = BucketedCalculator("uma-demo-cu", device="cpu")
    with pytest.raises(InvalidAtomsError, match="does not support Au; it supports Cu"):
        gold.get_potential_energy()


@pytest.mark.parametrize("pbc", [(True, True, False), (True, False, False)], ids=["slab", "wire"])
def test_slab_or_wire_stress_matches_finite_differences(pbc, consistent):
    """ASE's central differences under strain, the non-periodic axis's vector included."""
    atoms = structures()["slab"][1]
    atoms.pbc = pbc
    atoms.calc = BucketedCalculator(consistent, task_name="omat", dtype="float64", device="cpu",
                                    compile_mode="eager", bucket_size=64)
    numerical = calculate_numerical_stress(atoms, 1e-5)
    assert deviation(atoms.get_stress(), numerical) < 1e-7


def properties(calc: BucketedCalculator, atoms) -> dict:
    atoms = atoms.copy()
    atoms.calc = calc
    return atoms.get_properties(["energy", "energies", "forces", "stress"])


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_gives_identical_results_and_merges_its_own_experts(how, uma_checkpoints):
    """A copy (NEB images, multiprocessing) has its own merged expert weights: using it
    on another composition leaves the original's results unchanged."""
    calc = BucketedCalculator(uma_checkpoints["main"].path, task_name="omat", dtype="float64",
                              device="cpu", compile_mode="eager", bucket_size=64)
    alloy = structures()["bulk"][1]
    expected = properties(calc, alloy)
    other = copy.deepcopy(calc) if how == "deepcopy" else pickle.loads(pickle.dumps(calc))
    merged = [c.core.blocks[0].conv_1.m0.weight for c in (calc, other)]
    assert merged[0].data_ptr() != merged[1].data_ptr()
    experts = [c.core.blocks[0].conv_1.m0.experts for c in (calc, other)]
    assert (experts[0] is experts[1]) == (how == "deepcopy")  # never written: a copy shares them
    before = merged[0].clone()
    for name, value in properties(other, alloy).items():
        assert np.array_equal(value, expected[name]), name
    copper = alloy.copy()
    copper.numbers[:] = 29  # another composition: the copy re-merges its experts
    properties(other, copper)
    assert not torch.equal(merged[1], before) and torch.equal(merged[0], before)
    calc.reset()  # evaluate the original again (its core still holds the alloy's merge)
    for name, value in properties(calc, alloy).items():
        assert np.array_equal(value, expected[name]), name


def test_a_system_beyond_the_free_gpu_memory_is_refused_before_the_search(
    consistent, monkeypatch
):
    """The memory estimate (here against a pretended 64 MiB free) refuses 2048 Cu atoms in
    well under a second, names the estimate, and leaves the calculator usable."""
    import fastcalc.calculator

    monkeypatch.setattr(fastcalc.calculator, "free_memory", lambda device: 64 * 2**20)
    calc = BucketedCalculator(consistent, task_name="omat", device="cpu")
    small = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    big = small.repeat(4)
    assert calc.memory_estimate(len(small), 78) < 64 * 2**20 < calc.memory_estimate(len(big), 78)
    big.calc = calc
    with pytest.raises(InvalidAtomsError, match=r"2048 atoms .* need about .* GiB .* 0\.1 GiB"):
        started = time.perf_counter()
        big.get_potential_energy()
    assert time.perf_counter() - started < 1.0
    small.calc = calc
    assert np.isfinite(small.get_potential_energy())


def test_pairs_that_come_within_the_cutoff_between_searches_are_all_seen(
    uma_checkpoints, reference_calculator
):
    """The edge bucket is sized at the neighbour search (here to the pair exactly, with
    ``bucket_size=1``); when atoms then move less than ``skin / 2`` and more pairs come
    within the cutoff, the call runs again wider, without a new search, and agrees with
    fairchem."""
    path = uma_checkpoints["main"].path
    calc = BucketedCalculator(path, task_name="omol", dtype="float64", device="cpu",
                              compile_mode="eager", bucket_size=1)
    cube = bulk("Cu", "sc", a=2.4).repeat(2)
    gap = calc.cutoff + 0.05  # between facing atoms of two cubes
    pair = cube + cube
    pair.positions[8:] += [2.4 + gap, 0.0, 0.0]
    pair.pbc = False
    pair.info.update(charge=0, spin=1)
    evaluate(calc, pair)
    closer = pair.copy()
    closer.positions[8:] -= [0.2, 0.0, 0.0]  # less than skin / 2 = 0.25 Å
    before, after = (len(neighbor_list("i", a, calc.cutoff)) for a in (pair, closer))
    assert after > padded_size(before, 1, EDGE_FRACTION)  # more than the bucket holds
    ours = evaluate(calc, closer)
    assert calc.neighbors.searches == 1
    assert max(deviations(ours, evaluate(reference_calculator("main", "omol"), closer)).values()) < RTOL
