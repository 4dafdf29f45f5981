"""Loading metatomic exports and metatrain checkpoints: metadata and refused models."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from fastcalc.bench.upstream import pet_model
from fastcalc.pet.hypers import unsupported_features
from fastcalc.pet.load import NotPETModelError, load_pet

from .support import ATOMIC_TYPES, COMPOSITION, ENERGY_SCALE, metatrain_hypers


@pytest.mark.parametrize("suffix", [".pt", ".ckpt"])
def test_metadata_exposes_composition_energies_and_scale(suffix, loaded):
    _, metadata = loaded("fixed", suffix)
    assert metadata.composition_energies == COMPOSITION
    assert metadata.energy_scale == ENERGY_SCALE


@pytest.mark.parametrize("suffix", [".pt", ".ckpt"])
def test_metadata_describes_the_model(suffix, loaded):
    core, metadata = loaded("adaptive", suffix)
    assert metadata.cutoff == 4.0
    assert metadata.hypers.num_neighbors_adaptive == 6
    assert metadata.atomic_types == ATOMIC_TYPES == core.atomic_types
    assert metadata.dtype == torch.float64
    assert (metadata.length_unit, metadata.energy_unit) == ("Angstrom", "eV")


def checkpoint_with(tmp_path, **changes):
    """A .ckpt of a PET whose hyper-parameters differ from the test defaults by ``changes``."""
    model = pet_model(metatrain_hypers("fixed", **changes), ATOMIC_TYPES)
    path = tmp_path / "model.ckpt"
    torch.save(model.get_checkpoint(), path)
    return path


def test_grid_adaptive_cutoff_is_refused(tmp_path):
    path = checkpoint_with(tmp_path, num_neighbors_adaptive=6, adaptive_cutoff_method="grid")
    with pytest.raises(NotImplementedError, match="grid"):
        load_pet(path)


def test_zbl_models_are_refused(tmp_path):
    with pytest.raises(NotImplementedError, match="ZBL"):
        load_pet(checkpoint_with(tmp_path, zbl=True))


def test_long_range_models_are_refused():
    # building one needs torch-pme; the loader feeds PET's ``long_range`` flag here
    with pytest.raises(NotImplementedError, match="long-range"):
        unsupported_features(zbl=False, long_range=True)


def test_checkpoints_need_metatrain(monkeypatch, pet_models):
    monkeypatch.setitem(sys.modules, "metatrain.utils.io", None)
    with pytest.raises(ImportError, match="metatrain"):
        load_pet(pet_models["fixed"].ckpt)


def test_unknown_target_is_refused(pet_models):
    with pytest.raises(ValueError, match="no target 'dipole'"):
        load_pet(pet_models["fixed"].pt, target="dipole")


def test_a_uma_checkpoint_is_refused_naming_its_family(tmp_path):
    """Given to the PET calculator, under either suffix, a UMA checkpoint is named as one."""
    from fastcalc import CompiledPETCalculator
    from fastcalc.demo_models import UMA_DEMO_CU

    renamed = tmp_path / "uma.ckpt"
    renamed.write_bytes(UMA_DEMO_CU.read_bytes())
    for path in (UMA_DEMO_CU, renamed):
        with pytest.raises(NotPETModelError, match="not a PET model; it is a uma model"):
            CompiledPETCalculator(path, device="cpu", cache_dir=False)


def _text(path):
    path.write_text("not a model")


def _empty(path):
    path.write_bytes(b"")


def _dict(path):
    torch.save({"weights": torch.zeros(2)}, path)


def _tensor(path):
    torch.save(torch.zeros(2), path)


@pytest.mark.parametrize("suffix", [".pt", ".ckpt"])
@pytest.mark.parametrize("write", [_text, _empty, _dict, _tensor])
def test_files_that_hold_no_model_are_refused_by_name(tmp_path, suffix, write):
    path = tmp_path / f"model{suffix}"
    write(path)
    with pytest.raises(NotPETModelError, match=f"{re.escape(str(path))} is neither a metatomic"):
        load_pet(path)


def test_a_checkpoint_of_another_architecture_is_named(tmp_path):
    path = tmp_path / "model.ckpt"
    torch.save({"architecture_name": "soap_bpnn", "model_data": {}}, path)
    with pytest.raises(NotPETModelError, match="checkpoint of 'soap_bpnn', not of PET"):
        load_pet(path)


def test_a_metatomic_export_is_read_whatever_its_suffix(tmp_path):
    """The file's content, not its name, says how to read it."""
    from fastcalc.demo_models import PET_DEMO_CU

    renamed = tmp_path / "pet.ckpt"
    renamed.write_bytes(PET_DEMO_CU.read_bytes())
    core, metadata = load_pet(renamed)
    expected_core, expected = load_pet(PET_DEMO_CU)
    assert metadata.hypers == expected.hypers
    assert metadata.composition_energies == expected.composition_energies
    expected_state = expected_core.state_dict()
    assert all(torch.equal(value, expected_state[key]) for key, value in core.state_dict().items())
