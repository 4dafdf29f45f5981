"""A PET file's conversion is kept in the disk cache (:mod:`fastcalc.converted`): a later
calculator on the same file reads it instead of opening the file through metatomic, and
reads the file again when it changed or the stored conversion is damaged."""

from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch

import fastcalc.pet.calculator as pet_calculator
from fastcalc.compile_cache import CompileCache
from fastcalc.pet import CompiledPETCalculator
from fastcalc.pet.load import load_pet
from fastcalc.precision import freeze_linears


def build(path, cache_dir, mode="default"):
    """A calculator that compiles (not called here: nothing is compiled)."""
    return CompiledPETCalculator(path, device="cpu", dtype="float64", compile_mode=mode,
                                 cache_dir=cache_dir)


@pytest.fixture
def reads(monkeypatch):
    """The files the calculators read through metatomic or metatrain, in order."""
    files = []

    def reading(path, *args, **kwargs):
        files.append(path)
        return load_pet(path, *args, **kwargs)

    monkeypatch.setattr(pet_calculator, "load_pet", reading)
    return files


@pytest.fixture
def model_file(tmp_path, pet_models):
    """A copy of the charge- and spin-conditioned model's export, free to touch."""
    return shutil.copy(pet_models["conditioned"].pt, tmp_path / "model.pt")


@pytest.mark.parametrize("suffix", [".pt", ".ckpt"])
def test_a_second_calculator_reads_the_stored_conversion(tmp_path, pet_models, loaded, reads,
                                                         suffix):
    path = pet_models["conditioned"].pt if suffix == ".pt" else pet_models["conditioned"].ckpt
    build(path, tmp_path / "cache")
    second = build(path, tmp_path / "cache")
    assert reads == [path]
    core, metadata = loaded("conditioned", suffix)  # read by metatomic (metatrain) itself
    assert second.metadata == metadata
    expected = freeze_linears(copy.deepcopy(core)).state_dict()  # as the calculator holds it
    assert second.core.state_dict().keys() == expected.keys()
    for name, tensor in second.core.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_a_changed_file_is_read_again_and_its_old_conversion_dropped(tmp_path, model_file,
                                                                     reads):
    build(model_file, tmp_path / "cache")
    (before,) = CompileCache(tmp_path / "cache").converted()
    modified = os.stat(model_file).st_mtime_ns + 10**9
    os.utime(model_file, ns=(modified, modified))
    build(model_file, tmp_path / "cache")
    assert reads == [model_file, model_file]
    (after,) = CompileCache(tmp_path / "cache").converted()
    assert after != before


def test_a_damaged_conversion_is_reported_read_again_and_replaced(tmp_path, model_file, reads):
    build(model_file, tmp_path / "cache")
    (stored,) = CompileCache(tmp_path / "cache").converted()
    stored.write_bytes(stored.read_bytes()[:1000])
    with pytest.warns(UserWarning, match="converted model .* is unusable"):
        build(model_file, tmp_path / "cache")
    build(model_file, tmp_path / "cache")
    assert reads == [model_file, model_file]


def test_nothing_is_kept_eagerly_or_without_a_cache(tmp_path, model_file, monkeypatch):
    monkeypatch.setenv("FASTCALC_CACHE_DIR", str(tmp_path / "default"))
    build(model_file, tmp_path / "cache", mode="eager")
    build(model_file, False)
    assert not (tmp_path / "cache").exists()
    assert not (tmp_path / "default").exists()


def test_clearing_the_cache_removes_converted_models(tmp_path, model_file):
    build(model_file, tmp_path / "cache")
    cache = CompileCache(tmp_path / "cache")
    assert len(cache.converted()) == 1
    assert cache.clear() == 1
    assert cache.converted() == []


def test_the_log_says_where_the_model_came_from(tmp_path, model_file, caplog):
    with caplog.at_level("INFO", logger="fastcalc"):
        build(model_file, tmp_path / "cache")
        build(model_file, tmp_path / "cache")
    messages = [r.getMessage() for r in caplog.records if str(model_file) in r.getMessage()]
    assert len(messages) == 2
    assert "read and its conversion stored" in messages[0]
    assert "read from its stored conversion" in messages[1]


def test_each_file_keeps_its_own_conversion(tmp_path, model_file, reads):
    other = shutil.copy(model_file, tmp_path / "other.pt")
    for path in (model_file, other, model_file, other):
        build(path, tmp_path / "cache")
    assert reads == [model_file, other]
    assert len(CompileCache(tmp_path / "cache").converted()) == 2
