"""Our UMA core versus fairchem's own FAIRChemCalculator on the same checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from uma_reference import structures

from fastcalc.calculator import spans_volume
from fastcalc.plain_torch import plain_torch
from fastcalc.testing import Results, deviation, deviations, evaluate

RTOL = 1e-8


def assert_agree(ours: Results, reference: Results) -> None:
    """Energy, forces and (both or neither) stress within RTOL (fastcalc.testing's measure)."""
    assert (ours.stress is None) == (reference.stress is None)
    assert max(deviations(ours, reference).values()) < RTOL


@pytest.mark.parametrize("kind", ["main", "variant"])
@pytest.mark.parametrize("system", ["bulk", "slab", "molecule", "tiny", "isolated"])
def test_energy_forces_stress_match_fairchem(kind, system, reference_calculator, our_calculator):
    """Stress wherever the cell has a volume: the slab's too, for the cell as given."""
    task, atoms = structures()[system]
    stress = spans_volume(atoms.cell.array)
    ours = evaluate(our_calculator(kind, task), atoms, stress=stress)
    reference = evaluate(reference_calculator(kind, task), atoms, stress=stress)
    assert_agree(ours, reference)


@pytest.mark.parametrize("kind", ["main", "variant"])
@pytest.mark.parametrize("system", ["bulk", "molecule"])
def test_plain_torch_matches_fairchem(kind, system, reference_calculator, our_calculator):
    """Within plain_torch (a process's first, uncompiled calls) the edge operators and the
    radial networks' recomputation run as torch's own operators."""
    task, atoms = structures()[system]
    with plain_torch():
        ours = evaluate(our_calculator(kind, task), atoms)
    assert_agree(ours, evaluate(reference_calculator(kind, task), atoms))


def test_a_first_result_in_plain_torch_imports_no_compiler(uma_checkpoints):
    """The first call of any torch custom operator imports dynamo (a second or more): UMA's
    first result in plain torch calls none."""
    code = textwrap.dedent(f"""
        import json, sys
        from ase.build import bulk
        from fastcalc.plain_torch import plain_torch
        from fastcalc.uma import BucketedCalculator
        atoms = bulk("Cu", cubic=True)
        atoms.calc = BucketedCalculator({str(uma_checkpoints["main"].path)!r}, task_name="omat",
                                        device="cpu", compile_mode="eager")
        with plain_torch():
            atoms.get_forces()
        print(json.dumps(sorted(sys.modules)))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "fastcalc.uma.core" in loaded and "torch._dynamo" not in loaded


def test_composition_charge_spin_changes_remerge_in_place(reference_calculator, our_calculator):
    """One calculator instance walks through systems whose composition, charge and
    spin change; every result must match a fresh fairchem evaluation."""
    mol = structures()["molecule"][1]
    swapped = mol.copy()
    swapped.numbers[[0, 1]] = [7, 7]
    doubled = mol.copy()  # same reduced composition, twice the atoms (two far-apart copies)
    far = mol.copy()
    far.translate([12.0, 0.0, 0.0])
    doubled += far
    sequence = [
        (mol, 1, 2),
        (swapped, 1, 2),
        (swapped, 0, 1),
        (swapped, -1, 3),
        (doubled, -1, 3),
        (mol, 1, 2),
    ]
    ours_calc = our_calculator("main", "omol")
    merged = ours_calc.core.blocks[0].conv_1.m0.weight
    pointer = merged.data_ptr()
    previous = None
    for atoms, charge, spin in sequence:
        atoms = atoms.copy()
        atoms.info.update(charge=charge, spin=spin)
        assert_agree(evaluate(ours_calc, atoms), evaluate(reference_calculator("main", "omol"), atoms))
        snapshot = merged.clone()
        if previous is not None:
            assert not np.allclose(snapshot.numpy(), previous.numpy())  # really re-merged
        previous = snapshot
    assert merged.data_ptr() == pointer  # merged weights updated in place


def test_task_switch_matches_fairchem(uma_checkpoints, reference_calculator):
    """Switching the task of one core re-selects head, embedding and normalisers."""
    from fastcalc.uma import BucketedCalculator

    atoms = structures()["tiny"][1]
    calc = BucketedCalculator(
        uma_checkpoints["variant"].path, task_name="omat", dtype="float64", device="cpu",
        compile_mode="eager",
    )
    for task in ("omat", "oc20", "omol", "omat"):
        calc.set_task(task)
        assert_agree(evaluate(calc, atoms), evaluate(reference_calculator("variant", task), atoms))


@pytest.mark.parametrize("kind", ["main", "variant"])
@pytest.mark.parametrize("system", ["slab", "molecule"])
def test_per_atom_energies_are_fairchems_node_energies(kind, system, reference_calculator,
                                                       our_calculator):
    """fairchem's calculator has no per-atom energies; its energy block's output per atom
    (hooked) through our convention, raw_i * rmsd + mean / N + reference[Z_i], is ours."""
    task, atoms = structures()[system]
    calc = our_calculator(kind, task)
    ours = atoms.copy()
    ours.calc = calc
    energies = ours.get_potential_energies()
    reference = reference_calculator(kind, task)
    (block,) = [module for name, module in reference.predictor.model.named_modules()
                if name.endswith("energy_block")]
    nodes = []
    hook = block.register_forward_hook(lambda module, inputs, out: nodes.append(out.detach()))
    reference.reset()  # evaluate again, even if these atoms were its last
    try:
        energy = evaluate(reference, atoms).energy
    finally:
        hook.remove()
    spec = calc.core.task
    expected = (nodes[-1].double().reshape(-1).numpy() * spec.energy.rmsd
                + spec.energy.mean / len(atoms) + spec.element_references[atoms.numbers].numpy())
    assert energies.shape == (len(atoms),)
    assert deviation(energies, expected) < RTOL
    assert deviation(energies.sum(), energy) < RTOL


@pytest.mark.parametrize("kind", ["main", "variant"])
@pytest.mark.parametrize("system", ["bulk", "molecule"])
def test_coincident_atoms_give_fairchems_finite_results(kind, system, reference_calculator,
                                                         our_calculator):
    """A copy of an atom at its very position: fairchem leaves the zero-length pair out of
    its graph (before its neighbour limit, which ``variant`` applies), and so do we,
    instead of returning NaN."""
    task, atoms = structures()[system]
    atoms += atoms[[1]]
    ours = evaluate(our_calculator(kind, task), atoms)
    values = [ours.energy, ours.forces] + ([] if ours.stress is None else [ours.stress])
    assert all(np.isfinite(value).all() for value in values)
    assert_agree(ours, evaluate(reference_calculator(kind, task), atoms, stress=atoms.pbc.all()))


def test_build_topology_leaves_coincident_pairs_out_as_fairchem_does(reference_calculator,
                                                                     our_calculator):
    """The core on build_topology's graph (no calculator) gives fairchem's finite energy."""
    import torch

    from fastcalc.uma.graph import build_topology

    task, atoms = structures()["bulk"]
    atoms += atoms[[1]]
    core = our_calculator("variant", task).core
    edge_index, unit_shifts = build_topology(
        atoms.positions, atoms.cell.array, atoms.pbc, core.cutoff, core.max_neighbors
    )
    out = core.compute(
        torch.tensor(atoms.positions), torch.tensor(atoms.cell.array), torch.tensor(atoms.numbers),
        edge_index, unit_shifts,
    )
    atoms.calc = reference_calculator("variant", task)
    assert deviation(out["energy"].item(), atoms.get_potential_energy()) < RTOL
    assert deviation(out["forces"].numpy(), atoms.get_forces()) < RTOL


@pytest.mark.parametrize("kind", ["main", "variant"])
@pytest.mark.parametrize("periodic", [False, True], ids=["isolated", "periodic"])
def test_a_lone_atom_is_treated_as_fairchem_treats_it(kind, periodic, reference_calculator,
                                                       our_calculator):
    """Without periodic boundaries, fairchem evaluates one atom only for a checkpoint that
    declares ``supports_single_atoms`` (``variant``) and otherwise refuses it (``main``:
    a checkpoint file has no isolated-atom energies); in a periodic cell it evaluates it."""
    from ase import Atoms

    from fastcalc.calculator import InvalidAtomsError

    task = "omat" if periodic else "omol"
    atom = Atoms("Cu", positions=[[0.5, 1.0, 1.5]], cell=np.eye(3) * 12.0, pbc=periodic)
    ours, reference = our_calculator(kind, task), reference_calculator(kind, task)
    if kind == "main" and not periodic:
        with pytest.raises(ValueError, match="no atom_refs"):
            evaluate(reference, atom)
        with pytest.raises(InvalidAtomsError, match="single Cu atom without periodic boundaries"):
            evaluate(ours, atom)
        return
    assert_agree(evaluate(ours, atom), evaluate(reference, atom))
