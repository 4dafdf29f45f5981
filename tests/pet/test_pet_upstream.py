"""fastcalc's PET core reproduces metatrain/metatomic (float64, CPU) to round-off."""

from __future__ import annotations

import pytest

from fastcalc.testing import deviation

from .support import (
    CHARGED_STATE,
    MODEL_VARIANTS,
    PERIODIC_STRUCTURES,
    STRUCTURES,
    make_structure,
    run_fastcalc,
)

RTOL = 1e-9


@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("model", MODEL_VARIANTS)
def test_energy_matches_upstream(model, structure, loaded, reference):
    ours = run_fastcalc(*loaded(model), make_structure(structure))
    assert deviation(ours.energy, reference(model, structure).energy) < RTOL


@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("model", MODEL_VARIANTS)
def test_forces_match_upstream(model, structure, loaded, reference):
    ours = run_fastcalc(*loaded(model), make_structure(structure))
    assert deviation(ours.forces, reference(model, structure).forces) < RTOL


@pytest.mark.parametrize("structure", PERIODIC_STRUCTURES)
@pytest.mark.parametrize("model", MODEL_VARIANTS)
def test_stress_matches_upstream(model, structure, loaded, reference):
    ours = run_fastcalc(*loaded(model), make_structure(structure))
    assert deviation(ours.stress, reference(model, structure).stress) < RTOL


@pytest.mark.parametrize("model", MODEL_VARIANTS)
def test_checkpoint_loads_the_same_model_as_the_export(model, loaded, reference):
    ours = run_fastcalc(*loaded(model, ".ckpt"), make_structure("bulk"))
    expected = reference(model, "bulk")
    assert deviation(ours.energy, expected.energy) < RTOL
    assert deviation(ours.forces, expected.forces) < RTOL


def test_non_periodic_structure_has_no_stress(loaded):
    assert run_fastcalc(*loaded("fixed"), make_structure("molecule")).stress is None


@pytest.mark.parametrize("structure", ["bulk", "molecule"])
def test_charge_and_spin_conditioning_matches_upstream(structure, loaded, reference):
    ours = run_fastcalc(*loaded("conditioned"), make_structure(structure), **CHARGED_STATE)
    expected = reference("conditioned", structure, charged=True)
    assert deviation(ours.energy, expected.energy) < RTOL
    assert deviation(ours.forces, expected.forces) < RTOL


def test_charge_and_spin_change_the_energy(reference):
    neutral = reference("conditioned", "bulk").energy
    charged = reference("conditioned", "bulk", charged=True).energy
    assert abs(neutral - charged) > 1e-3 * abs(neutral)


def test_charge_outside_the_embedding_table_is_refused(loaded):
    with pytest.raises(ValueError, match="charge 4"):
        run_fastcalc(*loaded("conditioned"), make_structure("molecule"), charge=4)
