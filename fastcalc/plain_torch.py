"""Uncompiled calls without fastcalc's custom operators.

fastcalc's custom operators (UMA's edge operators, the recomputed radial networks, the
TF32 products) are made for compiled graphs: there they keep fewer tensors for the
backward pass, survive the compiler's passes and run fastcalc's Triton kernels.
Uncompiled, their first calls in a process cost seconds: torch imports dynamo at the
first call of any custom operator (it wraps each kernel in ``torch._disable_dynamo``),
and on CUDA the Triton kernels need Triton imported, their launchers built and the
kernels loaded. A calculator's first calls run uncompiled while its compiled model is
read or built (:class:`fastcalc.tracing.GraphRunner`), so they run within
:func:`plain_torch`, where the model's code computes the same with torch's own
operators: the same numbers to float32 round-off, every product in IEEE float32 (under
``precision="tf32"`` and ``"3xtf32"`` too), and more memory (autograd keeps what the
operators' backward passes recompute; a call that runs out of memory waits for the
compiled model).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["is_plain", "plain_torch"]

_PLAIN = contextvars.ContextVar("fastcalc_plain_torch", default=False)


@contextmanager
def plain_torch() -> Iterator[None]:
    """Within (this thread or task): fastcalc's model code calls none of its custom
    operators."""
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


def is_plain() -> bool:
    """Whether the caller runs within :func:`plain_torch`."""
    return _PLAIN.get()
