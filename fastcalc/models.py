"""Which calculator runs a model: bundled demo models by name, files by their format."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Literal

from ase.calculators.calculator import Calculator

from .calculator import resolve_device
from .demo_models import DEMO_MODELS_DIR

__all__ = ["DEMO_MODELS", "load_calculator", "model_family", "resolve_model_path"]

#: Bundled demonstration models (fitted to EMT copper), by name.
DEMO_MODELS = {
    "pet-demo-cu": DEMO_MODELS_DIR / "pet-demo-cu.pt",
    "uma-demo-cu": DEMO_MODELS_DIR / "uma-demo-cu.pt",
}


def resolve_model_path(model: str | Path) -> Path:
    """The file of a bundled model name, or ``model`` itself as a path that must exist."""
    if str(model) in DEMO_MODELS:
        return DEMO_MODELS[str(model)]
    path = Path(model).expanduser()
    if not path.is_file():
        names = ", ".join(DEMO_MODELS)
        raise FileNotFoundError(f"no model file {str(model)!r}; bundled models: {names}")
    return path


def model_family(path: Path) -> Literal["pet", "uma"]:
    """``"pet"`` for metatrain checkpoints and metatomic (TorchScript) exports, else ``"uma"``.

    A TorchScript archive holds compiled ``code/``; a fairchem checkpoint, written
    by ``torch.save``, holds only pickled data.
    """
    if path.suffix == ".ckpt":
        return "pet"
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is neither a metatomic/metatrain PET model nor a UMA checkpoint")
    names = zipfile.ZipFile(path).namelist()
    return "pet" if any("/code/" in name for name in names) else "uma"


def load_calculator(
    model: str | Path,
    *,
    task: str | None = None,
    device: str | None = None,
    dtype: str = "float32",
    compiled: bool | None = None,
) -> Calculator:
    """The fastcalc calculator for a bundled model name or a model file.

    ``compiled=None`` compiles on CUDA (CUDA graphs) and runs eagerly on CPU,
    where a first compilation takes about a minute.
    """
    path = resolve_model_path(model)
    mode = {None: "auto", True: "default", False: "eager"}[compiled]
    if mode == "default" and resolve_device(device).type == "cuda":
        mode = "reduce-overhead"
    if model_family(path) == "pet":
        from .pet import CompiledPETCalculator

        return CompiledPETCalculator(path, device=device, dtype=dtype, compile_mode=mode)
    from .uma import BucketedCalculator

    return BucketedCalculator(path, task_name=task, device=device, dtype=dtype, compile_mode=mode)
