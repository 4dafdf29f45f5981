"""Loading metatomic exports and metatrain checkpoints: metadata and refused models."""

from __future__ import annotations

import sys

import pytest
import torch

from fastcalc.bench.upstream import pet_model
from fastcalc.pet.hypers import unsupported_features
from fastcalc.pet.load import load_pet

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
