"""Recomputation in the backward pass: fewer tensors kept between forward and backward.

``recompute(fn, *inputs)`` returns ``fn(*inputs)`` but keeps only ``inputs`` for the
backward pass; there it evaluates ``fn`` again and differentiates that. Worth it where
``fn`` makes large intermediates cheaply from small or already-kept inputs (per-edge
gathers and rotations of per-atom features).

``make_fx`` traces the backward pass of a ``torch.autograd.Function`` when the traced
function calls ``torch.autograd.grad``, so a traced graph holds ``fn`` twice: once in
the forward part and once, recomputed, in the backward part.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["recompute"]


class _Recompute(torch.autograd.Function):
    """``fn(*inputs)`` whose backward pass evaluates ``fn`` again (see :func:`recompute`)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        fn: Callable[..., torch.Tensor],
        *inputs: torch.Tensor,
    ) -> torch.Tensor:
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        return fn(*inputs)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        wanted = [x for x in inputs if x.requires_grad]
        with torch.enable_grad():
            output = ctx.fn(*inputs)
        grads = iter(torch.autograd.grad(output, wanted, grad, allow_unused=True))
        return None, *(next(grads) if x.requires_grad else None for x in inputs)


def recompute(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """``fn(*inputs)``, differentiable in ``inputs``, recomputed in the backward pass.

    ``fn`` returns one tensor and must be a pure function of ``inputs``: tensors it reads
    from elsewhere (integer indices, weights) get no gradient, so every tensor that may
    require one must be among ``inputs``.
    """
    if not torch.is_grad_enabled() or not any(x.requires_grad for x in inputs):
        return fn(*inputs)
    return _Recompute.apply(fn, *inputs)
