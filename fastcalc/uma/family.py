"""UMA's model family: fairchem inference checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..archives import pickle_globals
from ..demo_models import UMA_DEMO_CU
from ..registry import ModelFamily, register
from .calculator import BucketedCalculator
from .checkpoint import CHECKPOINT_CLASS

if TYPE_CHECKING:
    from ..bench.suite import Contest

__all__ = ["FAMILY", "is_uma_file"]


def is_uma_file(path: Path) -> bool:
    """A ``torch.save`` archive whose root object is fairchem's ``MLIPInferenceCheckpoint``."""
    return " ".join(CHECKPOINT_CLASS) in pickle_globals(path)


def _build(
    path: Path,
    *,
    task: str | None,
    device: str | None,
    dtype: str,
    compile_mode: str,
    **options: object,
) -> BucketedCalculator:
    return BucketedCalculator(
        path, task_name=task, device=device, dtype=dtype, compile_mode=compile_mode, **options
    )


def _contest(folder: Path, device: str, small: bool) -> Contest:
    """``fastcalc bench uma`` (the bench is imported only when benchmarking)."""
    from ..bench.suite import uma_contest

    return uma_contest(folder, device, small)


FAMILY = register(
    ModelFamily(
        name="uma",
        formats="fairchem UMA inference checkpoints (.pt)",
        recognises=is_uma_file,
        build=_build,
        demo_models={"uma-demo-cu": UMA_DEMO_CU},
        contest=_contest,
    )
)
