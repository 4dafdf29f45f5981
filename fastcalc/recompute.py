"""Activation recomputation that survives ``make_fx`` tracing and ``torch.compile``.

:func:`recomputed` applies a function whose backward pass needs several of its own
intermediates (LayerNorm and SiLU chains, say) but keeps only its input: the backward
pass runs the function again. In a traced graph the recomputation would be the same
nodes as the forward pass's, which common-subexpression elimination merges back (and
then everything is kept again); so it starts from the input plus a zero made by an
opaque operator from the incoming gradient: no pass can merge that with the forward
pass, fold the zero away or move it before the backward pass, and the addition fuses
into the recomputation's first kernel (no copy of the input).

The recomputation runs in the context variables of the forward pass (fastcalc's
precision of the network's products, say): autograd runs the backward pass of CUDA
tensors on a thread of its own, where they would otherwise read their defaults.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

import torch
from torch.autograd.function import FunctionCtx

from .plain_torch import is_plain

Function = Callable[[torch.Tensor], torch.Tensor]

__all__ = ["recomputed"]


@torch.library.custom_op("fastcalc::zero_after", mutates_args=())
def _zero_after(after: torch.Tensor) -> torch.Tensor:
    """A zero scalar of ``after``'s dtype and device, computed only once ``after`` exists."""
    return after.new_zeros(())


@_zero_after.register_fake
def _(after: torch.Tensor) -> torch.Tensor:
    return after.new_empty(())


class _Recomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, fn: Function) -> torch.Tensor:
        ctx.fn = fn
        ctx.context = contextvars.copy_context()
        ctx.save_for_backward(x)
        return fn(x)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return ctx.context.run(_gradient, ctx.fn, x, grad), None


def _gradient(fn: Function, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient of ``fn`` at ``x`` along ``grad``, ``fn`` evaluated again."""
    with torch.enable_grad():
        # ``again`` is no leaf: module hooks (torch's FlopCounterMode, say) may not be
        # handed a leaf inside a backward pass
        again = x.detach().requires_grad_(True) + _zero_after(grad)
        (grad_x,) = torch.autograd.grad(fn(again), again, grad)
    return grad_x


def recomputed(fn: Function, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)``, differentiable in ``x``, keeping only ``x`` for the backward pass, which
    evaluates ``fn`` again. ``fn`` must be deterministic and differentiable in its input
    alone (frozen weights). Within :func:`fastcalc.plain_torch.plain_torch`, plain
    ``fn(x)``: the recomputation calls a custom operator."""
    return fn(x) if is_plain() else _Recomputed.apply(x, fn)
