"""UMA's gate between a layer's two SO(2) convolutions, as one operator with its own
backward pass.

The first convolution's outputs come as one 2-D tensor per order m
(:func:`fastcalc.uma.edge_ops.order_sizes` rows of C channels each, flattened): the m = 0
one starts with ``lmax * C`` gate channels, then its ``lmax + 1`` rows. The gate applies
SiLU to the ``l = 0`` row and multiplies every row of degree ``l >= 1`` (of every order,
+m and -m alike) by ``sigmoid`` of gate block ``l - 1``. An order m > 0 may come instead
as the three products of :class:`fastcalc.uma.layers.MixedLinear` ``(t0, t1, t2)``, which
the gate combines into its +m rows ``t0 - t1`` and -m rows ``t2 - t0 - t1`` as it reads
them, and whose gradients its backward pass gives. For its backward pass it keeps its
outputs of orders m > 0 (each its input times the gate), not its inputs: as large as the
inputs in blocks, two thirds of them in three parts.

Written with torch's operators and compiled for the CPU, inductor made four kernels of the
forward pass and five of the backward one per layer, with the sigmoids and the gradient of
the m = 0 output (gates and rows) as separate tensors (``benchmarks/kernel_bytes.py``).
The operator reads each input once and writes each output once, forward and backward
(on CUDA the Triton kernels of :mod:`fastcalc.uma.edge_kernels`); its torch code
(:func:`torch_edge_gate`) is also callable as itself, which autograd differentiates, for
uncompiled calls in plain torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import FunctionCtx as Context

from .edge_ops import fill_gradients

__all__ = ["edge_gate", "torch_edge_gate"]


def _channels(first: Tensor, lmax: int) -> int:
    """Channels C of a first convolution's m = 0 output (E, lmax * C + (lmax + 1) * C)."""
    return first.shape[1] // (2 * lmax + 1)


def _combined(block: Tensor) -> Tensor:
    """An order m > 0 output (E, 2 rows * C) of the first convolution, from the three
    products of :class:`fastcalc.uma.layers.MixedLinear` ``(t0, t1, t2)`` (3, E, rows * C)
    (``[t0 - t1, t2 - t0 - t1]``) or as given."""
    if block.dim() == 2:
        return block
    t0, t1, t2 = block
    return torch.cat((t0 - t1, t2 - t0 - t1), dim=1)


def in_three_parts(others: list[Tensor]) -> bool:
    """Whether the first convolution's outputs of orders m > 0, ``others``, come as the
    three products' parts (3, E, rows * C) rather than blocks (E, 2 rows * C)."""
    return bool(others) and others[0].dim() == 3


def gated_shapes(others: list[Tensor]) -> list[tuple[int, ...]]:
    """Shapes of the gated blocks of orders m > 0 (E, 2 rows * C), of the first
    convolution's outputs ``others``, as given or in three products' parts."""
    return [(b.shape[1], 2 * b.shape[2]) if b.dim() == 3 else tuple(b.shape) for b in others]


def input_shapes(gated: list[Tensor], three: bool) -> list[tuple[int, ...]]:
    """Shapes of the first convolution's outputs of orders m > 0, from the gated blocks."""
    return [(3, b.shape[0], b.shape[1] // 2) if three else tuple(b.shape) for b in gated]


def torch_edge_gate(first: Tensor, others: list[Tensor], lmax: int) -> list[Tensor]:
    """The gated blocks by order, each (E, rows * C), of the first convolution's outputs:
    ``first`` (E, lmax * C gate channels, then (lmax + 1) * C) and ``others``, order
    m >= 1's (E, 2 (lmax - m + 1) * C), +m rows then -m rows, or those as the three
    products' parts (3, E, (lmax - m + 1) * C). In torch's operators, which autograd
    differentiates; :func:`edge_gate` is the operator."""
    channels = _channels(first, lmax)
    gates = torch.sigmoid(first[:, : lmax * channels]).unflatten(1, (lmax, channels))
    m0 = first[:, lmax * channels:].unflatten(1, (lmax + 1, channels))
    out = [torch.cat((F.silu(m0[:, :1]), m0[:, 1:] * gates), dim=1).flatten(1)]
    for m, block in enumerate(map(_combined, others), start=1):
        out.append((block.unflatten(1, (2, -1, channels)) * gates[:, None, m - 1:]).flatten(1))
    return out


edge_gate = torch.library.custom_op("fastcalc::edge_gate", torch_edge_gate, mutates_args=())


@edge_gate.register_fake
def _(first: Tensor, others: list[Tensor], lmax: int) -> list[Tensor]:
    channels = _channels(first, lmax)
    return [first.new_empty(first.shape[0], (lmax + 1) * channels),
            *(first.new_empty(shape) for shape in gated_shapes(others))]


def _torch_gate_backward(
    grads: list[Tensor], first: Tensor, gated: list[Tensor], lmax: int, three: bool
) -> list[Tensor]:
    """Gradients of :func:`edge_gate` in ``first``, then in each of its other inputs
    (with ``three``, as three products' parts), from those in its outputs, ``grads``, given
    ``first`` and its outputs of orders m > 0, ``gated``. The gates' gradient reads the
    outputs: each is its input times the gate, whose derivative is gate * (1 - gate)."""
    channels = _channels(first, lmax)
    pre = first[:, : lmax * channels].unflatten(1, (lmax, channels))
    sig = torch.sigmoid(pre)
    m0 = first[:, lmax * channels:].unflatten(1, (lmax + 1, channels))
    grad0 = grads[0].unflatten(1, (lmax + 1, channels))
    scalar, sig_scalar = m0[:, :1], torch.sigmoid(m0[:, :1])
    grad_scalar = grad0[:, :1] * sig_scalar * (1 + scalar * (1 - sig_scalar))  # SiLU'
    # (E, lmax, C): sum of grad * input over m = 0's rows, of grad * output over the others
    grad_gates = grad0[:, 1:] * m0[:, 1:] * sig
    grad_others = []
    for m, (block, grad) in enumerate(zip(gated, grads[1:]), start=1):
        grad = grad.unflatten(1, (2, -1, channels))
        grad_input = grad * sig[:, None, m - 1:]  # (E, 2, rows, C)
        if three:  # through y+ = t0 - t1 and y- = t2 - t0 - t1
            plus, minus = grad_input.unbind(1)
            grad_input = torch.stack((plus - minus, -plus - minus, minus))
            grad_others.append(grad_input.flatten(2))
        else:
            grad_others.append(grad_input.flatten(1))
        grad_gates[:, m - 1:] += (grad * block.unflatten(1, (2, -1, channels))).sum(dim=1)
    grad_first = torch.cat(
        ((grad_gates * (1 - sig)).flatten(1), grad_scalar.flatten(1),
         (grad0[:, 1:] * sig).flatten(1)),
        dim=1,
    )
    return [grad_first, *grad_others]


edge_gate_backward = torch.library.custom_op(
    "fastcalc::edge_gate_backward", _torch_gate_backward, mutates_args=()
)


@edge_gate_backward.register_fake
def _(grads: list[Tensor], first: Tensor, gated: list[Tensor], lmax: int,
      three: bool) -> list[Tensor]:
    return [torch.empty_like(first), *(first.new_empty(s) for s in input_shapes(gated, three))]


def _gate_setup(ctx: Context, inputs: tuple, output: list[Tensor]) -> None:
    first, others, ctx.lmax = inputs
    ctx.three = in_three_parts(others)
    ctx.save_for_backward(first, *output[1:])
    ctx.shapes = [block.shape for block in output]


def _gate_backward(ctx: Context, grads: list[Tensor | None]) -> tuple:
    first, *gated = ctx.saved_tensors
    grad_first, *grad_others = edge_gate_backward(
        fill_gradients(grads, ctx.shapes, first), first, gated, ctx.lmax, ctx.three
    )
    return grad_first, grad_others, None


edge_gate.register_autograd(_gate_backward, setup_context=_gate_setup)


@edge_gate.register_kernel("cuda")
def _(first: Tensor, others: list[Tensor], lmax: int) -> list[Tensor]:
    from . import edge_kernels

    if len(others) > edge_kernels.MAX_ORDER:
        return torch_edge_gate(first, others, lmax)
    return edge_kernels.gate(first, others, lmax)


@edge_gate_backward.register_kernel("cuda")
def _(grads: list[Tensor], first: Tensor, gated: list[Tensor], lmax: int,
      three: bool) -> list[Tensor]:
    from . import edge_kernels

    if len(gated) > edge_kernels.MAX_ORDER:
        return _torch_gate_backward(grads, first, gated, lmax, three)
    return edge_kernels.gate_backward(grads, first, gated, lmax, three)
