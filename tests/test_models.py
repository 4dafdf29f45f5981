"""Bundled model names and model files map to the right calculator family."""

import pytest

from fastcalc.models import DEMO_MODELS, model_family, resolve_model_path


def test_bundled_models_are_shipped_and_recognised():
    assert model_family(resolve_model_path("pet-demo-cu")) == "pet"
    assert model_family(resolve_model_path("uma-demo-cu")) == "uma"
    assert all(path.stat().st_size < 5e6 for path in DEMO_MODELS.values())


def test_a_missing_model_names_the_bundled_ones():
    with pytest.raises(FileNotFoundError, match="no model file 'nope.pt'; bundled models: pet-demo-cu"):
        resolve_model_path("nope.pt")


def test_a_file_of_another_format_is_refused(tmp_path):
    path = tmp_path / "model.pt"
    path.write_text("not a model")
    with pytest.raises(ValueError, match="neither a metatomic/metatrain PET model nor a UMA"):
        model_family(path)
