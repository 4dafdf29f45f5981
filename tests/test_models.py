"""Bundled model names and model files map to the family whose calculator runs them;
a file no family reads is refused with the families named."""

import zipfile

import pytest
import torch
from ase.calculators.emt import EMT

from fastcalc import registry
from fastcalc.bench.suite import PET_TINY
from fastcalc.bench.upstream import build_checkpoint, default_backbone, pet_model
from fastcalc.models import (
    DEMO_MODELS,
    load_calculator,
    model_family,
    resolve_model_path,
)
from fastcalc.registry import ModelFamily, UnknownModelError, register

UNKNOWN = r"is not a model file of any known family: pet \(.*\); uma \(.*\)"


def test_bundled_models_are_shipped_and_recognised():
    assert model_family(resolve_model_path("pet-demo-cu")) == "pet"  # a metatomic export
    assert model_family(resolve_model_path("uma-demo-cu")) == "uma"  # a fairchem checkpoint
    assert all(path.stat().st_size < 5e6 for path in DEMO_MODELS.values())


def test_a_metatrain_checkpoint_of_pet_is_pet(tmp_path):
    path = tmp_path / "model.ckpt"
    torch.save(pet_model(PET_TINY, [29]).get_checkpoint(), path)
    assert model_family(path) == "pet"


def test_a_random_weight_fairchem_checkpoint_is_uma(tmp_path):
    path = tmp_path / "model.pt"
    build_checkpoint(path, default_backbone(), "UMA-S-1.2", seed=0)
    assert model_family(path) == "uma"


def test_a_missing_model_names_the_bundled_ones():
    with pytest.raises(FileNotFoundError, match="no model file 'nope.pt'; bundled models: pet-demo-cu"):
        resolve_model_path("nope.pt")


@pytest.mark.parametrize("family", ["pet", "uma"])
def test_a_folder_is_named_as_a_folder(family, tmp_path):
    """Not "no model file": the folder exists, and holding a model is not enough."""
    from fastcalc import BucketedCalculator, CompiledPETCalculator

    calculator = {"pet": CompiledPETCalculator, "uma": BucketedCalculator}[family]
    folder = tmp_path / "model.pt"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=f"'{folder}' is a folder, not a model file"):
        calculator(folder, device="cpu")


@pytest.mark.parametrize("kind", ["metatomic export", "metatrain checkpoint"])
def test_a_pet_model_given_to_the_uma_calculator_is_named_as_one(kind, tmp_path):
    from fastcalc import BucketedCalculator
    from fastcalc.demo_models import PET_DEMO_CU
    from fastcalc.uma import NotUMACheckpointError

    path = PET_DEMO_CU
    if kind == "metatrain checkpoint":
        path = tmp_path / "model.ckpt"
        torch.save(pet_model(PET_TINY, [29]).get_checkpoint(), path)
    with pytest.raises(NotUMACheckpointError, match="; it is a pet model"):
        BucketedCalculator(path, device="cpu")


def write_zip(path):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/notes.txt", "not a model")


@pytest.mark.parametrize(
    "write",
    [
        lambda path: path.write_text("not a model"),
        write_zip,
        lambda path: torch.save({"architecture_name": "soap_bpnn", "state": {}}, path),
        lambda path: torch.jit.script(torch.nn.Linear(2, 1)).save(str(path)),
    ],
    ids=["text", "zip", "metatrain checkpoint of another model", "another TorchScript model"],
)
def test_a_file_no_family_reads_is_refused_naming_the_families(write, tmp_path):
    path = tmp_path / "model.pt"
    write(path)
    with pytest.raises(UnknownModelError, match=UNKNOWN):
        model_family(path)
    with pytest.raises(UnknownModelError, match=UNKNOWN):
        load_calculator(path, device="cpu")


@pytest.fixture
def toy(monkeypatch, tmp_path) -> list:
    """A registered family that reads ``.toy`` files with ASE's EMT, with a demo model;
    the list of the (path, options) it built calculators for."""
    monkeypatch.setattr(registry, "_registered", dict(registry.families()))
    demo = tmp_path / "demo.toy"
    demo.write_text("EMT")
    built = []

    def build(path, *, task, device, dtype, compile_mode):
        built.append((path, task, device, dtype, compile_mode))
        return EMT()

    family = ModelFamily(
        name="toy", formats="EMT stand-ins (.toy)", recognises=lambda path: path.suffix == ".toy",
        build=build, demo_models={"toy-demo": demo},
    )
    register(family)
    return built


def test_a_registered_family_is_found_and_builds_its_calculator(toy, tmp_path):
    assert model_family(resolve_model_path("toy-demo")) == "toy"
    assert isinstance(load_calculator("toy-demo", task="t", device="cpu", compiled=False), EMT)
    assert toy == [(tmp_path / "demo.toy", "t", "cpu", "float32", "eager")]
    assert model_family(resolve_model_path("pet-demo-cu")) == "pet"  # the others still are


def test_the_calculators_compile_mode_passes_through(toy):
    load_calculator("toy-demo", task="t", device="cpu", compile_mode="default")
    assert toy[-1][-1] == "default"
    with pytest.raises(TypeError, match="compiled or compile_mode"):
        load_calculator("toy-demo", device="cpu", compiled=True, compile_mode="default")


@pytest.mark.usefixtures("toy")
def test_an_unknown_file_names_a_registered_family_too(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text("not a model")
    with pytest.raises(UnknownModelError, match=r"; toy \(EMT stand-ins \(.toy\)\)"):
        model_family(path)


@pytest.mark.usefixtures("toy")
def test_a_family_name_is_registered_once():
    with pytest.raises(ValueError, match="'toy' is already registered"):
        register(registry.families()["toy"])


@pytest.mark.parametrize("family", ["pet", "uma"])
def test_a_missing_gpu_is_named_before_the_model_file_is_read(family, monkeypatch, tmp_path):
    """The check comes first: a file that does not exist is not even looked for."""
    from fastcalc import BucketedCalculator, CompiledPETCalculator

    calculator = {"pet": CompiledPETCalculator, "uma": BucketedCalculator}[family]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available here"):
        calculator(tmp_path / "missing.pt", device="cuda")


def test_a_bucket_size_below_one_is_refused_before_the_checkpoint_is_read(tmp_path):
    from fastcalc import BucketedCalculator

    with pytest.raises(ValueError, match="bucket_size must be a positive integer, got 0"):
        BucketedCalculator(tmp_path / "missing.pt", bucket_size=0, device="cpu")
