"""PET's model family: metatomic exports and metatrain checkpoints of metatrain's PET."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..demo_models import PET_DEMO_CU
from ..registry import ModelFamily, TaskNotSupportedError, register
from .calculator import CompiledPETCalculator
from .load import is_pet_file

if TYPE_CHECKING:
    from ..bench.suite import Contest

__all__ = ["FAMILY", "is_pet_file"]


def _build(
    path: Path,
    *,
    task: str | None,
    device: str | None,
    dtype: str,
    compile_mode: str,
    **options: object,
) -> CompiledPETCalculator:
    """PET has no tasks: a ``task`` is refused, so that it is not silently ignored."""
    if task is not None:
        raise TaskNotSupportedError(
            f"PET models have no tasks, got task {task!r} (tasks are UMA's dataset heads)"
        )
    return CompiledPETCalculator(
        path, device=device, dtype=dtype, compile_mode=compile_mode, **options
    )


def _contest(folder: Path, device: str, small: bool) -> Contest:
    """``fastcalc bench pet`` (the bench is imported only when benchmarking)."""
    from ..bench.suite import pet_contest

    return pet_contest(folder, device, small)


FAMILY = register(
    ModelFamily(
        name="pet",
        formats="metatomic exports (.pt) and metatrain checkpoints (.ckpt) of PET",
        recognises=is_pet_file,
        build=_build,
        demo_models={"pet-demo-cu": PET_DEMO_CU},
        contest=_contest,
    )
)
