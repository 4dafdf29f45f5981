"""UMA's edge work as two operators with their own backward passes.

Each layer gathers both atoms' features into the edge frame, scales them by the
layer's radial output (the first SO(2) convolution's input), and, after the
convolutions, rotates the messages back and adds them to the centre atoms. Written
with torch's operators, autograd keeps the gathered and rotated (E, M, 2C) tensors of
every layer for the backward pass; these operators keep only what they were given
(node features, rotations, radial outputs, messages) and gather and rotate again in
their backward pass.

``rotation`` (E, M, K) holds each edge's Wigner-D matrix densely, its rows in the
edge-frame (m-major) order and its columns degree-major (see :func:`edge_rotations`),
so one code path serves any ``lmax`` and ``mmax``. On CUDA the operators run the
Triton kernels of :mod:`fastcalc.uma.edge_kernels` (plain float FMAs, never TF32);
elsewhere the torch code here. Both are registered as torch custom operators, so
``make_fx`` records them (forward and backward) and CUDA graphs replay them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx as Context

from .so3 import coefficient_degrees

Grads = tuple[Tensor, Tensor, Tensor]

__all__ = ["edge_pairs", "edge_rotations", "edge_to_nodes", "radial_rows", "rotation_index"]


def rotation_index(lmax: int, order: list[int]) -> torch.Tensor:
    """Where each entry of the dense rotation (``len(order)`` rows, (lmax+1)^2 columns)
    comes from in the row ``[1, D_1.flatten(), ..., D_lmax.flatten(), 0]`` of an edge:
    ``order`` lists the degree-major component of each row (:func:`m_major_order`)."""
    degrees = coefficient_degrees(lmax)
    starts = [0, 1]
    for degree in range(1, lmax + 1):
        starts.append(starts[-1] + (2 * degree + 1) ** 2)
    zero = starts[-1]
    index = []
    for row in order:
        degree = degrees[row]
        a = row - degree * degree
        for column, column_degree in enumerate(degrees):
            if column_degree != degree:
                index.append(zero)
            else:
                index.append(starts[degree] + a * (2 * degree + 1) + column - degree * degree)
    return torch.tensor(index).view(len(order), len(degrees))


def edge_rotations(blocks: list[torch.Tensor], index: torch.Tensor) -> torch.Tensor:
    """Dense rotations (E, M, K) from the Wigner-D blocks (E, 2l+1, 2l+1) of degrees
    ``1..lmax`` (``blocks[0]``, degree 0, is ignored: exactly 1) and
    :func:`rotation_index`."""
    first = blocks[1]
    flat = torch.cat(
        (first.new_ones(first.shape[0], 1), *(b.flatten(1) for b in blocks[1:]),
         first.new_zeros(first.shape[0], 1)),
        dim=1,
    )
    return flat.index_select(1, index.flatten()).view(-1, *index.shape)


def radial_rows(lmax: int, mmax: int) -> list[int]:
    """Row of the radial scales, viewed as (E, rows, 2C), of each edge-frame component:
    one row per degree of m = 0, then for each m > 0 one per degree, shared by the +m
    and -m components (the layout of the first SO(2) convolution's radial network)."""
    rows = list(range(lmax + 1))
    for m in range(1, mmax + 1):
        degrees = list(range(rows[-1] + 1, rows[-1] + 1 + lmax - m + 1))
        rows += degrees + degrees
    return rows


# ---------------------------------------------------------------- edge pairs
@torch.library.custom_op("fastcalc::edge_pairs", mutates_args=())
def edge_pairs(
    x: torch.Tensor,
    rotation: torch.Tensor,
    radial: torch.Tensor,
    neighbour: torch.Tensor,
    centre: torch.Tensor,
    mmax: int,
) -> torch.Tensor:
    """Scaled edge-frame pairs (E, M, 2C): ``[R_e x[neighbour_e], R_e x[centre_e]]``,
    each component times its row (:func:`radial_rows`) of ``radial`` (E, rows * 2C), for
    node features ``x`` (N, K, C) and rotations ``rotation`` (E, M, K)."""
    pairs = torch.cat(
        (torch.bmm(rotation, x.index_select(0, neighbour)),
         torch.bmm(rotation, x.index_select(0, centre))),
        dim=2,
    )
    return pairs * _scales(radial, _rows(x, mmax), pairs.shape[2])


def _rows(x: torch.Tensor, mmax: int) -> torch.Tensor:
    """:func:`radial_rows` for node features ``x`` (N, (lmax+1)^2, C), on their device."""
    return torch.tensor(radial_rows(math.isqrt(x.shape[1]) - 1, mmax), device=x.device)


def _scales(radial: torch.Tensor, rows: torch.Tensor, width: int) -> torch.Tensor:
    return radial.view(radial.shape[0], -1, width).index_select(1, rows)


@edge_pairs.register_fake
def _(
    x: Tensor, rotation: Tensor, radial: Tensor, neighbour: Tensor, centre: Tensor, mmax: int
) -> Tensor:
    return x.new_empty(rotation.shape[0], rotation.shape[1], 2 * x.shape[2])


@torch.library.custom_op("fastcalc::edge_pairs_backward", mutates_args=())
def edge_pairs_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    rotation: torch.Tensor,
    radial: torch.Tensor,
    neighbour: torch.Tensor,
    centre: torch.Tensor,
    mmax: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`edge_pairs` in ``x``, ``rotation`` and ``radial``."""
    channels = x.shape[2]
    gathered = (x.index_select(0, neighbour), x.index_select(0, centre))
    rotated = torch.cat([torch.bmm(rotation, part) for part in gathered], dim=2)
    rows = _rows(x, mmax)
    scaled = grad * _scales(radial, rows, 2 * channels)
    grad_radial = radial.new_zeros(radial.shape[0], radial.shape[1] // (2 * channels), 2 * channels)
    grad_radial = grad_radial.index_add(1, rows, grad * rotated).view_as(radial)
    sides = scaled.split(channels, dim=2)
    grad_rotation = sum(torch.bmm(side, part.mT) for side, part in zip(sides, gathered))
    grad_x = torch.zeros_like(x)
    for side, index in zip(sides, (neighbour, centre)):
        grad_x = grad_x.index_add(0, index, torch.bmm(rotation.mT, side))
    return grad_x, grad_rotation, grad_radial


@edge_pairs_backward.register_fake
def _(grad: Tensor, x: Tensor, rotation: Tensor, radial: Tensor, *indices: Tensor | int) -> Grads:
    return torch.empty_like(x), torch.empty_like(rotation), torch.empty_like(radial)


def _pairs_setup(ctx: Context, inputs: tuple, output: torch.Tensor) -> None:
    *tensors, ctx.mmax = inputs
    ctx.save_for_backward(*tensors)


def _pairs_backward(ctx: Context, grad: torch.Tensor) -> tuple:
    grads = edge_pairs_backward(grad.contiguous(), *ctx.saved_tensors, ctx.mmax)
    return (*grads, None, None, None)


edge_pairs.register_autograd(_pairs_backward, setup_context=_pairs_setup)


# ---------------------------------------------------------------- edges to nodes
@torch.library.custom_op("fastcalc::edge_to_nodes", mutates_args=())
def edge_to_nodes(
    x: torch.Tensor,
    messages: torch.Tensor,
    rotation: torch.Tensor,
    envelope: torch.Tensor,
    centre: torch.Tensor,
) -> torch.Tensor:
    """``x`` (N, K, C) plus, at each edge's centre atom, its edge-frame ``messages``
    (E, M, C) rotated back (``R_e^T``) and times ``envelope`` (E,)."""
    back = torch.bmm(rotation.mT, messages) * envelope.view(-1, 1, 1)
    return x.index_add(0, centre, back)


@edge_to_nodes.register_fake
def _(x: Tensor, messages: Tensor, rotation: Tensor, envelope: Tensor, centre: Tensor) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("fastcalc::edge_to_nodes_backward", mutates_args=())
def edge_to_nodes_backward(
    grad: torch.Tensor,
    messages: torch.Tensor,
    rotation: torch.Tensor,
    envelope: torch.Tensor,
    centre: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`edge_to_nodes` in ``messages``, ``rotation`` and ``envelope``
    (in ``x`` it is ``grad`` itself)."""
    at_centre = grad.index_select(0, centre)  # (E, K, C)
    products = torch.bmm(messages, at_centre.mT)  # (E, M, K): sum_c m_ic g_kc
    scale = envelope.view(-1, 1, 1)
    grad_envelope = (products * rotation).sum(dim=(1, 2))
    return torch.bmm(rotation, at_centre) * scale, products * scale, grad_envelope


@edge_to_nodes_backward.register_fake
def _(
    grad: Tensor, messages: Tensor, rotation: Tensor, envelope: Tensor, centre: Tensor
) -> Grads:
    return torch.empty_like(messages), torch.empty_like(rotation), torch.empty_like(envelope)


def _nodes_setup(ctx: Context, inputs: tuple, output: torch.Tensor) -> None:
    _, messages, rotation, envelope, centre = inputs
    ctx.save_for_backward(messages, rotation, envelope, centre)


def _nodes_backward(ctx: Context, grad: torch.Tensor) -> tuple:
    grads = edge_to_nodes_backward(grad.contiguous(), *ctx.saved_tensors)
    return (grad, *grads, None)


edge_to_nodes.register_autograd(_nodes_backward, setup_context=_nodes_setup)


# ---------------------------------------------------------------- CUDA kernels
@edge_pairs.register_kernel("cuda")
def _(*args: Tensor | int) -> Tensor:
    from . import edge_kernels

    return edge_kernels.pairs(*args)


@edge_pairs_backward.register_kernel("cuda")
def _(*args: Tensor | int) -> Grads:
    from . import edge_kernels

    return edge_kernels.pairs_backward(*args)


@edge_to_nodes.register_kernel("cuda")
def _(*args: Tensor) -> Tensor:
    from . import edge_kernels

    return edge_kernels.to_nodes(*args)


@edge_to_nodes_backward.register_kernel("cuda")
def _(*args: Tensor) -> Grads:
    from . import edge_kernels

    return edge_kernels.to_nodes_backward(*args)
