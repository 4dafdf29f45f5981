"""A fresh process for the tests of fastcalc's Triton kernels on the CPU: ``CALLS OUT`` runs
them in Triton's interpreter (which ``TRITON_INTERPRET=1`` selects only if set before
Triton is imported, hence a process of its own). CALLS holds a list of (function,
arguments): a function is ``module:name`` (a kernel's wrapper) or a name of this module;
each result is saved, in that order, to OUT."""

from __future__ import annotations

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402


def tf32x3_tile(config: int, a: torch.Tensor, b: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """``a @ b (+ bias)`` by the three-TF32 product kernel with tile ``CONFIGS[config]``,
    launched past its autotuner (which times its tiles on a GPU)."""
    from fastcalc import tf32x3_kernel

    tile = tf32x3_kernel.CONFIGS[config].kwargs
    return tf32x3_kernel._launch(tf32x3_kernel._matmul_kernel.fn, a, b, bias, **tile)


def resolve(function: str):
    """The function named ``module:name``, or ``name`` of this module."""
    module, _, name = function.rpartition(":")
    return getattr(importlib.import_module(module) if module else sys.modules[__name__], name)


if __name__ == "__main__":
    calls = torch.load(sys.argv[1])
    torch.save([resolve(function)(*args) for function, args in calls], sys.argv[2])
