"""CompiledPETCalculator against metatomic's ASE calculator on the same exported model
(float64, CPU): eager runs on every kind of structure, one compiled run across buckets."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.calculator import PropertyNotImplementedError
from ase.calculators.fd import calculate_numerical_stress
from ase.stress import full_3x3_to_voigt_6_stress
from torch._dynamo.utils import counters

import fastcalc.pet.calculator as calculator_module
from fastcalc import InvalidAtomsError
from fastcalc.buckets import padded_size
from fastcalc.neighbors import neighbor_list
from fastcalc.pet import CompiledPETCalculator, PaddedShape
from fastcalc.pet.layout import build_layout, exact_shape
from fastcalc.pet.padding import ATOM_STEP, WIDTH_STEP
from fastcalc.testing import check_calculator, deviation

from .support import (
    ATOMIC_TYPES,
    CHARGED_STATE,
    Reference,
    compile_test_model,
    make_structure,
    upstream_calculator,
    upstream_results,
)

RTOL = 1e-9
CALCULATOR_STRUCTURES = ("bulk", "slab", "molecule", "tiny", "isolated", "single")


def assert_matches(atoms: Atoms, expected: Reference, rtol: float = RTOL) -> None:
    """Energy, free energy, forces and (3D-periodic) Voigt stress of ``atoms.calc``."""
    assert deviation(atoms.get_potential_energy(), expected.energy) < rtol
    assert atoms.get_potential_energy() == atoms.get_potential_energy(force_consistent=True)
    assert deviation(atoms.get_forces(), expected.forces) < rtol
    if expected.stress is not None:
        voigt = full_3x3_to_voigt_6_stress(expected.stress)
        assert deviation(atoms.get_stress(), voigt) < rtol


def evaluated(atoms: Atoms, calculator, **info) -> Atoms:
    atoms = atoms.copy()
    atoms.info.update(info)
    atoms.calc = calculator
    return atoms


@pytest.mark.parametrize("model", ["adaptive", "conditioned"])
def test_passes_check_calculator_against_metatomic(model, eager, pet_models):
    """Adaptive cutoffs; charge and spin conditioning (its refusals)."""
    upstream = upstream_calculator(pet_models[model])
    with torch.jit.optimized_execution(False), warnings.catch_warnings():
        # metatomic also forms a (meaningless) stress for non-periodic systems
        warnings.simplefilter("ignore", RuntimeWarning)
        report = check_calculator(eager(model), upstream, numbers=ATOMIC_TYPES, bond=1.5)
    assert report.with_status("skipped") == []


@pytest.mark.parametrize("structure", CALCULATOR_STRUCTURES)
@pytest.mark.parametrize("model", ["fixed", "adaptive"])
def test_eager_calculator_matches_upstream(model, structure, eager, reference):
    atoms = evaluated(make_structure(structure), eager(model))
    assert_matches(atoms, reference(model, structure))


def upstream_property(calculator, atoms: Atoms, name: str) -> np.ndarray:
    """metatomic's ``name`` ("stress", "energies") for a copy of ``atoms``."""
    atoms = atoms.copy()
    atoms.calc = calculator
    with torch.jit.optimized_execution(False), warnings.catch_warnings():
        # metatomic warns that a slab's stress is "likely to be wrong": it is the
        # derivative for the cell as given, vacuum included, which is what is compared
        warnings.simplefilter("ignore", UserWarning)
        return atoms.get_properties([name])[name]


@pytest.mark.parametrize("model", ["fixed", "adaptive"])
def test_slab_stress_matches_metatomic(model, eager, pet_models):
    atoms = evaluated(make_structure("slab"), eager(model))
    expected = upstream_property(upstream_calculator(pet_models[model]), atoms, "stress")
    assert np.abs(expected).max() > 1e-3
    assert deviation(atoms.get_stress(), expected) < RTOL


@pytest.mark.parametrize("pbc", [(True, True, False), (True, False, False)], ids=["slab", "wire"])
def test_slab_or_wire_stress_matches_finite_differences(pbc, eager):
    """ASE's central differences under strain, the non-periodic axis's vector included."""
    atoms = evaluated(make_structure("slab"), eager("adaptive"))
    atoms.pbc = pbc
    numerical = calculate_numerical_stress(atoms, 1e-5)
    assert deviation(atoms.get_stress(), numerical) < 1e-7


def test_stress_needs_a_cell_with_a_volume(eager):
    atoms = make_structure("slab")
    atoms.cell[2] = 0.0  # no cell vector along the non-periodic axis
    atoms = evaluated(atoms, eager("fixed"))
    with pytest.raises(PropertyNotImplementedError, match="linearly independent"):
        atoms.get_stress()
    assert np.isfinite(atoms.get_forces()).all()


@pytest.mark.parametrize("structure", ["bulk", "slab", "molecule"])
def test_per_atom_energies_match_metatomic(structure, eager, pet_models):
    """Scaled network energies plus composition energies, padded atoms dropped."""
    atoms = evaluated(make_structure(structure), eager("adaptive"))
    energies = atoms.get_potential_energies()
    expected = upstream_property(upstream_calculator(pet_models["adaptive"]), atoms, "energies")
    assert energies.shape == (len(atoms),)
    assert deviation(energies, expected) < RTOL
    assert energies.sum() == pytest.approx(atoms.get_potential_energy(), rel=1e-14)


def test_per_atom_energies_come_with_energy_and_forces(pet_models, monkeypatch):
    calculator = CompiledPETCalculator(
        pet_models["fixed"].pt, device="cpu", dtype="float64", compile_mode="eager"
    )
    calls = []
    evaluate = calculator.evaluate
    monkeypatch.setattr(calculator, "evaluate", lambda system: calls.append(1) or evaluate(system))
    atoms = evaluated(make_structure("bulk"), calculator)
    atoms.get_forces()
    atoms.get_potential_energies()
    atoms.get_stress()
    assert len(calls) == 1


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_calculator_gives_identical_results(how, pet_models):
    """A copy has its own core (NEB images, multiprocessing), and the same results."""
    calculator = CompiledPETCalculator(
        pet_models["conditioned"].pt, device="cpu", dtype="float64", compile_mode="eager"
    )
    atoms = evaluated(make_structure("bulk"), calculator, **CHARGED_STATE)
    names = ["energy", "energies", "forces", "stress"]
    expected = atoms.get_properties(names)
    other = copy.deepcopy(calculator) if how == "deepcopy" else pickle.loads(pickle.dumps(calculator))
    assert other.core is not calculator.core and other._runner.fn.core is other.core
    copied = evaluated(make_structure("bulk"), other, **CHARGED_STATE).get_properties(names)
    for name in names:
        assert np.array_equal(copied[name], expected[name]), name


@pytest.mark.parametrize("source", ["ckpt", "loaded pair"])
def test_checkpoint_or_loaded_model(source, pet_models, loaded, reference):
    model = pet_models["adaptive"].ckpt if source == "ckpt" else loaded("adaptive", ".pt")
    calculator = CompiledPETCalculator(model, device="cpu", dtype="float64", compile_mode="eager")
    assert_matches(evaluated(make_structure("bulk"), calculator), reference("adaptive", "bulk"))


def test_a_loaded_pair_is_left_as_it_was(pet_models):
    """The calculator works on a copy: the caller's core keeps its maps, dtype and weights."""
    from fastcalc.pet.load import load_pet

    core, metadata = load_pet(pet_models["adaptive"].pt)
    before = {name: tensor.clone() for name, tensor in core.state_dict().items()}
    kinds = [type(module) for module in core.modules()]
    CompiledPETCalculator((core, metadata), device="cpu", dtype="float64", compile_mode="eager")
    assert [type(module) for module in core.modules()] == kinds
    after = core.state_dict()
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype and torch.equal(after[name], tensor), name


def test_float32_calculator_is_close_to_upstream(pet_models, reference):
    calculator = CompiledPETCalculator(pet_models["fixed"].pt, device="cpu", compile_mode="eager")
    assert calculator.core.edge_type_embedding.weight.dtype == torch.float32
    assert_matches(evaluated(make_structure("bulk"), calculator), reference("fixed", "bulk"), 1e-4)


def test_bundled_model_by_name():
    from metatomic_ase import MetatomicCalculator

    from fastcalc.demo_models import PET_DEMO_CU

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.rattle(0.05, seed=2)
    calculator = CompiledPETCalculator("pet-demo-cu", device="cpu", compile_mode="eager")
    expected = upstream_results(MetatomicCalculator(str(PET_DEMO_CU), device="cpu"), atoms)
    assert_matches(evaluated(atoms, calculator), expected, 1e-4)


def test_heavy_padding_contributes_nothing(eager, reference, monkeypatch):
    """Far more padded atoms, slots and candidate pairs than any bucket adds: same numbers."""

    def generous(atoms, width, pool):
        return PaddedShape(atoms + 37, width + 9, pool + 500)

    monkeypatch.setattr(calculator_module, "padded_shape", generous)
    for structure in ("bulk", "molecule"):
        atoms = evaluated(make_structure(structure), eager("adaptive"))
        assert_matches(atoms, reference("adaptive", structure))


def test_a_too_narrow_layout_is_widened(pet_models, reference, monkeypatch):
    """If an atom has more kept neighbours than the layout has slots, the call is redone wider."""

    def narrow(atoms, width, pool):
        return PaddedShape(padded_size(atoms, ATOM_STEP), 2, pool + 64)

    monkeypatch.setattr(calculator_module, "padded_shape", narrow)
    calculator = CompiledPETCalculator(
        pet_models["adaptive"].pt, device="cpu", dtype="float64", compile_mode="eager"
    )
    assert_matches(evaluated(make_structure("bulk"), calculator), reference("adaptive", "bulk"))
    assert calculator._topology.shape.width > 2


def test_small_moves_reuse_one_search_and_match_upstream(pet_models):
    """Between neighbour searches the kept edges are re-chosen on every geometry."""
    calculator = CompiledPETCalculator(
        pet_models["adaptive"].pt, device="cpu", dtype="float64", compile_mode="eager"
    )
    upstream = upstream_calculator(pet_models["adaptive"])
    atoms = make_structure("bulk")
    rng = np.random.default_rng(5)
    for _ in range(3):
        atoms.positions += rng.uniform(-0.03, 0.03, atoms.positions.shape)
        assert_matches(evaluated(atoms, calculator), upstream_results(upstream, atoms))
    assert calculator.neighbors.searches == 1


@pytest.mark.parametrize("structure", ["bulk", "molecule"])
def test_padded_layout_is_consistent(structure, loaded):
    """Padded atoms are nobody's neighbour and have none; reverse slots hold reversed edges."""
    core, metadata = loaded("adaptive")
    atoms = make_structure(structure)
    positions = torch.tensor(atoms.positions)
    cell = torch.tensor(atoms.cell.array if atoms.pbc.any() else 10.0 * np.eye(3))
    numbers = torch.tensor(atoms.numbers)
    edge_index, shifts = neighbor_list(positions, cell, torch.tensor(atoms.pbc), metadata.cutoff)
    layout, padded = (
        build_layout(
            positions, cell, numbers, edge_index, shifts, metadata.hypers, core.species_index,
            shape=shape,
        )
        for shape in (exact_shape, lambda atoms, width, pool: PaddedShape(atoms + 5, width + 3, pool + 7))
    )
    n = len(atoms)
    assert not padded.mask[n:].any()
    assert (padded.neighbors[padded.mask] < n).all()
    centres = torch.arange(n + 5)[:, None].expand_as(padded.neighbors)
    back = padded.reverse[padded.mask]
    assert torch.equal(centres.reshape(-1)[back], padded.neighbors[padded.mask])
    assert torch.equal(padded.neighbors.reshape(-1)[back], centres[padded.mask])
    assert torch.equal(padded.shifts.reshape(-1, 3)[back], -padded.shifts[padded.mask])
    real = layout.pool_neighbors.shape[1]
    assert padded.pool_neighbors.shape == (n + 5, real + 7)
    torch.testing.assert_close(padded.pool_neighbors[:n, :real], layout.pool_neighbors)
    extra = torch.ones_like(padded.pool_neighbors, dtype=torch.bool)
    extra[:n, :real] = False
    padding = padded.pool_shifts[extra].double() @ cell
    assert (padding.norm(dim=1) > metadata.cutoff).all()
    torch.testing.assert_close(padded.radii[:n], layout.radii, rtol=1e-14, atol=0)


def test_bucket_sizes():
    for step in (ATOM_STEP, WIDTH_STEP):
        sizes = [padded_size(count, step) for count in range(5000)]
        assert all(size >= max(count, step) for count, size in enumerate(sizes))
        assert all(size - count <= max(step, count / 8) for count, size in enumerate(sizes))
        assert all(size % step == 0 for size in sizes)
        assert sizes == sorted(sizes) and len(set(sizes)) < 80


def test_charge_and_spin_from_atoms_info(eager, reference):
    calculator = eager("conditioned")
    atoms = evaluated(make_structure("bulk"), calculator, **CHARGED_STATE)
    assert_matches(atoms, reference("conditioned", "bulk", charged=True))
    atoms.info = {"charge": 1, "spin": 2}  # OMol's key for the multiplicity
    assert_matches(atoms, reference("conditioned", "bulk", charged=True))
    atoms.info = {}
    assert_matches(atoms, reference("conditioned", "bulk"))


def test_models_without_conditioning_ignore_charge(eager, reference):
    atoms = evaluated(make_structure("bulk"), eager("fixed"), charge=3, spin=4)
    assert_matches(atoms, reference("fixed", "bulk"))


@pytest.mark.parametrize(
    "info, message", [({"charge": 4}, "charge 4"), ({"spin": 0}, "multiplicity 0")]
)
def test_charge_or_spin_just_outside_the_tables_is_refused(info, message, eager):
    """The model's own bounds (check_calculator covers the generic cases and the
    calculator's state afterwards)."""
    atoms = evaluated(make_structure("molecule"), eager("conditioned"), **info)
    with pytest.raises(InvalidAtomsError, match=message):
        atoms.get_potential_energy()


def test_old_compile_keyword_still_works_with_a_deprecation_warning(pet_models):
    with pytest.warns(DeprecationWarning, match="compile_mode='auto', 'eager'"):
        calculator = CompiledPETCalculator(pet_models["fixed"].pt, device="cpu", compile=False)
    assert calculator.compile_mode == "eager"


def test_auto_runs_eagerly_on_cpu(pet_models):
    assert CompiledPETCalculator(pet_models["fixed"].pt, device="cpu").compile_mode == "eager"


def test_unknown_compile_mode_is_refused(pet_models):
    with pytest.raises(ValueError, match="compile_mode must be one of 'auto', 'eager'"):
        CompiledPETCalculator(pet_models["fixed"].pt, device="cpu", compile_mode="fast")


@pytest.fixture(scope="module")
def compile_model(tmp_path_factory):
    return compile_test_model(tmp_path_factory.mktemp("compiled"))


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


@pytest.mark.compile
def test_compiled_calculator_across_buckets(compile_model):
    """Sizes within a bucket, charge and spin compile nothing new; crossing a bucket at
    most one graph; results kept from an earlier call stay intact."""
    calculator = CompiledPETCalculator(
        compile_model.pt, device="cpu", dtype="float64", compile_mode="default",
        compile_in_background=False,
    )
    upstream = upstream_calculator(compile_model)

    def check(structure: str, **state) -> None:
        atoms = evaluated(make_structure(structure), calculator, **state)
        assert_matches(atoms, upstream_results(upstream, make_structure(structure), **state))

    check("bulk")  # 10 atoms: the bucket of 16
    kept = calculator.results
    kept_forces = kept["forces"].copy()
    compiled = graphs()
    check("slab")  # 9 atoms: same atom bucket, other widths and pool sizes
    check("bulk", **CHARGED_STATE)
    assert graphs() == compiled
    check("molecule")  # 8 and 2 atoms: the bucket of 8
    check("tiny")
    assert graphs() == compiled
    stats = calculator.compile_stats
    assert (stats["compilations"], stats["cuda_graphs"], stats["recompiles"]) == (1, 0, 0)
    assert np.array_equal(kept["forces"], kept_forces)


def test_todict_records_the_settings_that_differ_from_the_defaults():
    calculator = CompiledPETCalculator("pet-demo-cu", device="cpu", dtype="float64")
    assert calculator.todict() == {"model": "pet-demo-cu", "device": "cpu", "dtype": "float64"}


def test_no_disk_cache_is_recorded_as_false_not_as_a_folder_named_false():
    """A calculator rebuilt from todict() (a trajectory's record) must keep no cache either,
    and set() takes the constructor's own value as unchanged."""
    calculator = CompiledPETCalculator("pet-demo-cu", device="cpu", cache_dir=False)
    assert calculator.todict()["cache_dir"] is False
    assert calculator.set(cache_dir=False) == {}
