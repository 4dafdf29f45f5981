"""Our UMA core versus fairchem's own FAIRChemCalculator on the same checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from uma_reference import structures

from fastcalc.calculator import spans_volume
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
