"""Which calculator runs a model: bundled demo models by name, files by their family.

The families (PET, UMA, ...) and their demo models are in :mod:`fastcalc.registry`;
this module is the entry point the command line and the examples use.
"""

from __future__ import annotations

from pathlib import Path

from ase.calculators.calculator import Calculator

from .calculator import resolve_device
from .registry import demo_models, family_of, resolve_model_path

__all__ = ["DEMO_MODELS", "load_calculator", "model_family", "resolve_model_path"]

#: Bundled demonstration models (fitted to EMT copper), by name.
DEMO_MODELS = demo_models()


def model_family(path: Path) -> str:
    """The name of the registered family whose files ``path`` is (``"pet"``, ``"uma"``, ...);
    :class:`~fastcalc.registry.UnknownModelError` names the known ones otherwise."""
    return family_of(path).name


def load_calculator(
    model: str | Path,
    *,
    task: str | None = None,
    device: str | None = None,
    dtype: str = "float32",
    compiled: bool | None = None,
    **options: object,
) -> Calculator:
    """The fastcalc calculator for a bundled model name or a model file.

    ``compiled=None`` compiles on CUDA (CUDA graphs) and runs eagerly on CPU,
    where a first compilation takes about a minute. ``options`` go to the calculator
    (``precision``, ``cache_dir``, ``skin``, ...), the calculators' own ``compile_mode``
    among them, which takes the place of ``compiled``.
    """
    path = resolve_model_path(model)
    if "compile_mode" in options:
        if compiled is not None:
            raise TypeError("load_calculator takes compiled or compile_mode, not both")
    else:
        mode = {None: "auto", True: "default", False: "eager"}[compiled]
        if mode == "default" and resolve_device(device).type == "cuda":
            mode = "reduce-overhead"
        options["compile_mode"] = mode
    return family_of(path).build(path, task=task, device=device, dtype=dtype, **options)
