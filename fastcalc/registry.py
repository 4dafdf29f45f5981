"""Model families: which calculator runs a model file, and the bundled demo models.

Each family (PET, UMA, ...) registers a :class:`ModelFamily` from its subpackage's
``family`` module: its name, how to recognise its files, how to build its calculator,
its demo models and its ``fastcalc bench`` contest. This module imports no calculator;
the built-in families' modules are imported at the first lookup, so that the
calculators can use :func:`resolve_model_path` without an import circle. A new
family is a subpackage with a ``family`` module plus its line in ``BUILTIN_FAMILIES``
(or a call to :func:`register` from anywhere).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ase.calculators.calculator import Calculator

__all__ = [
    "BUILTIN_FAMILIES",
    "Builder",
    "ModelFamily",
    "TaskNotSupportedError",
    "UnknownModelError",
    "another_family",
    "demo_models",
    "families",
    "family_of",
    "register",
    "resolve_model_path",
]

#: Modules that register the families fastcalc ships, imported at the first lookup.
BUILTIN_FAMILIES = ("fastcalc.pet.family", "fastcalc.uma.family")


class Builder(Protocol):
    """Builds a family's calculator for a model file."""

    def __call__(
        self,
        path: Path,
        *,
        task: str | None,
        device: str | None,
        dtype: str,
        compile_mode: str,
        **options: object,
    ) -> Calculator:
        """The calculator for the model at ``path``; ``options`` are further keyword
        arguments of :class:`fastcalc.calculator.TorchCalculator` (``precision``,
        ``cache_dir``, ...). A family without tasks raises :class:`TaskNotSupportedError`
        for a ``task`` other than ``None``."""


@dataclass(frozen=True)
class ModelFamily:
    """One kind of model: ``recognises(path)`` tells its files, ``build`` makes its
    calculator, ``formats`` names its files in error messages; ``contest(folder, device,
    small)`` is its ``fastcalc bench`` contest, if it has one."""

    name: str
    formats: str
    recognises: Callable[[Path], bool]
    build: Builder
    demo_models: Mapping[str, Path] = field(default_factory=dict)
    contest: Callable[[Path, str, bool], Any] | None = None


class UnknownModelError(ValueError):
    """A model file that no registered family recognises."""


class TaskNotSupportedError(ValueError):
    """A task was asked of a model whose family has none (PET): refused rather than ignored."""


_registered: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Add ``family`` (its name must be new) and return it."""
    if family.name in _registered:
        raise ValueError(f"a model family named {family.name!r} is already registered")
    _registered[family.name] = family
    return family


def families() -> dict[str, ModelFamily]:
    """The registered families by name, the built-in ones first."""
    for module in BUILTIN_FAMILIES:
        importlib.import_module(module)
    return dict(_registered)


def demo_models() -> dict[str, Path]:
    """Every family's bundled demo models, by name."""
    return {name: path for family in families().values()
            for name, path in family.demo_models.items()}


def resolve_model_path(model: str | Path) -> Path:
    """The file of a bundled model name, or ``model`` itself as a path that must exist;
    the error for a misspelt bundled name suggests the closest one, and a folder is named
    as one."""
    bundled = demo_models()
    if str(model) in bundled:
        return bundled[str(model)]
    path = Path(model).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"{str(model)!r} is a folder, not a model file: name the file")
    if not path.is_file():
        close = difflib.get_close_matches(str(model), bundled, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        raise FileNotFoundError(
            f"no model file {str(model)!r}{guess}; bundled models: {', '.join(bundled)}"
        )
    return path


def family_of(path: Path) -> ModelFamily:
    """The first registered family that recognises the file at ``path``."""
    known = families()
    for family in known.values():
        if family.recognises(path):
            return family
    formats = "; ".join(f"{family.name} ({family.formats})" for family in known.values())
    raise UnknownModelError(f"{path} is not a model file of any known family: {formats}")


def another_family(path: Path, family: str) -> str:
    """For an error saying that ``path`` is not a model of ``family``: what it is instead,
    when another registered family reads it (else nothing), and how to load it."""
    try:
        other = family_of(path)
    except UnknownModelError:
        return ""
    if other.name == family:
        return ""
    return (f"; it is a {other.name} model ({other.formats}): "
            "fastcalc.models.load_calculator picks the calculator from the file")
