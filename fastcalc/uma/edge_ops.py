"""UMA's edge work as two operators with their own backward passes.

Each layer gathers both atoms' features into the edge frame, scales them by the
layer's radial output (the first SO(2) convolution's input), and, after the
convolutions, rotates the messages back and adds them to the centre atoms. Written
with torch's operators, autograd keeps the gathered and rotated (E, M, 2C) tensors of
every layer for the backward pass; these operators keep only what they were given
(node features, rotations, radial outputs, messages) and gather and rotate again in
their backward pass.

Edge-frame features travel as one tensor per order m (:func:`order_sizes`): the
``m = 0`` rows (E, lmax+1, C), then for each m > 0 the +m and -m rows (E, 2(lmax-m+1),
C), as the SO(2) convolutions take and give them. With ``three``, :func:`edge_pairs` gives
each m > 0 block in three parts instead (:func:`three_parts`): the input of Gauss's three
products of a complex pair (:class:`fastcalc.uma.layers.MixedLinear`). Each block is the input or output
of its own matrix product, so no operator here or in the backward pass concatenates
the blocks into one (E, M, C) tensor or splits one: on the H200 at 1008 atoms such
copies of every layer took more GPU time than the operators themselves.

``wigner`` (E, S) holds each edge's Wigner-D matrix compactly, its blocks by degree
flattened one after the other (``[1, D_1.flatten(), ..., D_lmax.flatten()]``, S =
sum of (2l+1)^2: 35 for lmax 2; see :func:`compact_rotations`): the entries outside
the blocks are zero and never stored, read or multiplied. The torch code here expands
it to the dense (E, M, K) matrix whose rows are in the edge-frame (m-major) order
(:func:`dense_rotations`); on CUDA the operators run the Triton kernels of
:mod:`fastcalc.uma.edge_kernels` (plain float FMAs, never TF32), which read the blocks
directly. Gradients in ``wigner`` come back in the same layout. Both are registered as
torch custom operators, so ``make_fx`` records them (forward and backward) and CUDA
graphs replay them; their torch code is also callable as itself
(:func:`torch_edge_pairs`, :func:`torch_edge_to_nodes`), which autograd differentiates,
for uncompiled calls in plain torch (:mod:`fastcalc.plain_torch`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx as Context

from .so3 import coefficient_degrees, m_major_order

Grads = tuple[Tensor, Tensor, Tensor]

__all__ = [
    "compact_rotations",
    "three_parts",
    "dense_rotations",
    "edge_pairs",
    "edge_to_nodes",
    "fill_gradients",
    "order_sizes",
    "pairs_shapes",
    "radial_rows",
    "rotation_index",
]


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


def compact_rotations(blocks: list[torch.Tensor]) -> torch.Tensor:
    """Each edge's Wigner-D blocks (E, 2l+1, 2l+1) of degrees ``0..lmax``, flattened one
    after the other into (E, S); degree 0 (exactly 1) is stored as the constant 1."""
    first = blocks[1]
    return torch.cat((first.new_ones(first.shape[0], 1), *(b.flatten(1) for b in blocks[1:])), dim=1)


def _index(lmax: int, mmax: int, device: torch.device) -> torch.Tensor:
    return rotation_index(lmax, m_major_order(lmax, mmax)).to(device)


def dense_rotations(wigner: torch.Tensor, lmax: int, mmax: int) -> torch.Tensor:
    """The dense rotations (E, M, K), rows in the edge-frame order, of compact ones (E, S)."""
    index = _index(lmax, mmax, wigner.device)
    padded = torch.cat((wigner, wigner.new_zeros(wigner.shape[0], 1)), dim=1)
    return padded.index_select(1, index.flatten()).view(-1, *index.shape)


def _compact_gradient(grad: torch.Tensor, lmax: int, mmax: int, size: int) -> torch.Tensor:
    """The gradient in compact rotations (E, ``size``) of one in dense rotations (E, M, K)."""
    index = _index(lmax, mmax, grad.device)
    compact = grad.new_zeros(grad.shape[0], size + 1)
    return compact.index_add(1, index.flatten(), grad.flatten(1))[:, :size].contiguous()


def _degrees(x: torch.Tensor) -> int:
    """``lmax`` of node features ``x`` (N, (lmax+1)^2, C)."""
    return math.isqrt(x.shape[1]) - 1


def radial_rows(lmax: int, mmax: int) -> list[int]:
    """Row of the radial scales, viewed as (E, rows, 2C), of each edge-frame component:
    one row per degree of m = 0, then for each m > 0 one per degree, shared by the +m
    and -m components (the layout of the first SO(2) convolution's radial network)."""
    rows = list(range(lmax + 1))
    for m in range(1, mmax + 1):
        degrees = list(range(rows[-1] + 1, rows[-1] + 1 + lmax - m + 1))
        rows += degrees + degrees
    return rows


def order_sizes(lmax: int, mmax: int) -> list[int]:
    """Rows of each order's block of edge-frame features: lmax + 1 for m = 0, then, for
    each m = 1..mmax, 2 (lmax - m + 1): its +m rows (degrees m..lmax), then its -m rows."""
    return [lmax + 1] + [2 * (lmax - m + 1) for m in range(1, mmax + 1)]


def _blocks(edge: Tensor, lmax: int, mmax: int) -> list[Tensor]:
    """Each order's rows of edge-frame features ``edge`` (E, M, ...) as a tensor of its own."""
    return [
        block.clone(memory_format=torch.contiguous_format)
        for block in edge.split(order_sizes(lmax, mmax), dim=1)
    ]


def three_parts(block: Tensor) -> Tensor:
    """An m > 0 block (E, 2R, ...) of +m rows then -m rows as three parts (3, E, R, ...):
    the +m rows, the -m rows, and their sum."""
    plus, minus = block.chunk(2, dim=1)
    return torch.stack((plus, minus, plus + minus))


def _two_parts_gradient(grad: Tensor) -> Tensor:
    """The gradient in an m > 0 block (E, 2R, ...) of one in its :func:`three_parts`."""
    return torch.cat((grad[0] + grad[2], grad[1] + grad[2]), dim=1)


def fill_gradients(
    grads: list[Tensor | None], shapes: list[torch.Size], like: Tensor
) -> list[Tensor]:
    """``grads`` of blocks of ``shapes``, with zeros (``like``'s kind) where a block
    received none."""
    return [like.new_zeros(shape) if g is None else g.contiguous() for g, shape in zip(grads, shapes)]


# ---------------------------------------------------------------- edge pairs
def _dense_pairs(
    x: Tensor, wigner: Tensor, radial: Tensor, neighbour: Tensor, centre: Tensor, mmax: int
) -> Tensor:
    """:func:`edge_pairs` as one (E, M, 2C) tensor, rows in the edge-frame order."""
    rotation = dense_rotations(wigner, _degrees(x), mmax)
    pairs = torch.cat(
        (torch.bmm(rotation, x.index_select(0, neighbour)),
         torch.bmm(rotation, x.index_select(0, centre))),
        dim=2,
    )
    return pairs * _scales(radial, _rows(x, mmax), pairs.shape[2])


def torch_edge_pairs(
    x: torch.Tensor,
    wigner: torch.Tensor,
    radial: torch.Tensor,
    neighbour: torch.Tensor,
    centre: torch.Tensor,
    mmax: int,
    three: bool,
) -> list[torch.Tensor]:
    """Scaled edge-frame pairs by order (:func:`order_sizes`), each (E, rows, 2C):
    ``[R_e x[neighbour_e], R_e x[centre_e]]``, each component times its row
    (:func:`radial_rows`) of ``radial`` (E, rows * 2C), for node features ``x`` (N, K, C)
    and compact rotations ``wigner`` (E, S); with ``three``, each m > 0 block in its
    :func:`three_parts` (3, E, rows / 2, 2C). In torch's operators, which autograd
    differentiates; :func:`edge_pairs` is the operator."""
    first, *others = _blocks(
        _dense_pairs(x, wigner, radial, neighbour, centre, mmax), _degrees(x), mmax
    )
    return [first, *(map(three_parts, others) if three else others)]


edge_pairs = torch.library.custom_op("fastcalc::edge_pairs", torch_edge_pairs, mutates_args=())


def _rows(x: torch.Tensor, mmax: int) -> torch.Tensor:
    """:func:`radial_rows` for node features ``x`` (N, (lmax+1)^2, C), on their device."""
    return torch.tensor(radial_rows(_degrees(x), mmax), device=x.device)


def _scales(radial: torch.Tensor, rows: torch.Tensor, width: int) -> torch.Tensor:
    return radial.view(radial.shape[0], -1, width).index_select(1, rows)


def pairs_shapes(x: Tensor, wigner: Tensor, mmax: int, three: bool) -> list[tuple[int, ...]]:
    """Shapes of :func:`edge_pairs`' blocks."""
    edges, width = wigner.shape[0], 2 * x.shape[2]
    first, *others = order_sizes(_degrees(x), mmax)
    return [(edges, first, width),
            *((3, edges, rows // 2, width) if three else (edges, rows, width) for rows in others)]


@edge_pairs.register_fake
def _(
    x: Tensor, wigner: Tensor, radial: Tensor, neighbour: Tensor, centre: Tensor, mmax: int,
    three: bool,
) -> list[Tensor]:
    return [x.new_empty(shape) for shape in pairs_shapes(x, wigner, mmax, three)]


def _torch_pairs_backward(
    grads: list[torch.Tensor],
    x: torch.Tensor,
    wigner: torch.Tensor,
    radial: torch.Tensor,
    neighbour: torch.Tensor,
    centre: torch.Tensor,
    mmax: int,
    three: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`edge_pairs` in ``x``, ``wigner`` and ``radial``, from those
    in its blocks, ``grads`` (with ``three``, those of m > 0 in three parts)."""
    if three:
        grads = [grads[0], *map(_two_parts_gradient, grads[1:])]
    grad = torch.cat(grads, dim=1)
    channels = x.shape[2]
    rotation = dense_rotations(wigner, _degrees(x), mmax)
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
    grad_wigner = _compact_gradient(grad_rotation, _degrees(x), mmax, wigner.shape[1])
    return grad_x, grad_wigner, grad_radial


edge_pairs_backward = torch.library.custom_op(
    "fastcalc::edge_pairs_backward", _torch_pairs_backward, mutates_args=()
)


@edge_pairs_backward.register_fake
def _(grads: list[Tensor], x: Tensor, wigner: Tensor, radial: Tensor,
      *indices: Tensor | int) -> Grads:
    return torch.empty_like(x), torch.empty_like(wigner), torch.empty_like(radial)


def _pairs_setup(ctx: Context, inputs: tuple, output: list[Tensor]) -> None:
    *tensors, ctx.mmax, ctx.three = inputs
    ctx.save_for_backward(*tensors)
    ctx.shapes = [block.shape for block in output]


def _pairs_backward(ctx: Context, grads: list[Tensor | None]) -> tuple:
    x = ctx.saved_tensors[0]
    grads = fill_gradients(grads, ctx.shapes, x)
    grads = edge_pairs_backward(grads, *ctx.saved_tensors, ctx.mmax, ctx.three)
    return (*grads, None, None, None, None)


edge_pairs.register_autograd(_pairs_backward, setup_context=_pairs_setup)


# ---------------------------------------------------------------- edges to nodes
def torch_edge_to_nodes(
    x: torch.Tensor,
    messages: list[torch.Tensor],
    wigner: torch.Tensor,
    envelope: torch.Tensor,
    centre: torch.Tensor,
    mmax: int,
) -> torch.Tensor:
    """``x`` (N, K, C) plus, at each edge's centre atom, its edge-frame ``messages`` (by
    order, :func:`order_sizes`, each (E, rows, C)) rotated back (``R_e^T``, from the
    compact ``wigner``) and times ``envelope`` (E,). In torch's operators;
    :func:`edge_to_nodes` is the operator."""
    rotation = dense_rotations(wigner, _degrees(x), mmax)
    back = torch.bmm(rotation.mT, torch.cat(messages, dim=1)) * envelope.view(-1, 1, 1)
    return x.index_add(0, centre, back)


edge_to_nodes = torch.library.custom_op(
    "fastcalc::edge_to_nodes", torch_edge_to_nodes, mutates_args=()
)


@edge_to_nodes.register_fake
def _(x: Tensor, messages: list[Tensor], wigner: Tensor, envelope: Tensor, centre: Tensor,
      mmax: int) -> Tensor:
    return torch.empty_like(x)


def _torch_to_nodes_backward(
    grad: torch.Tensor,
    messages: list[torch.Tensor],
    wigner: torch.Tensor,
    envelope: torch.Tensor,
    centre: torch.Tensor,
    mmax: int,
) -> list[torch.Tensor]:
    """Gradients of :func:`edge_to_nodes` in each block of ``messages``, then in
    ``wigner`` and in ``envelope`` (in ``x`` it is ``grad`` itself)."""
    lmax = _degrees(grad)
    rotation = dense_rotations(wigner, lmax, mmax)
    at_centre = grad.index_select(0, centre)  # (E, K, C)
    products = torch.bmm(torch.cat(messages, dim=1), at_centre.mT)  # (E, M, K): sum_c m_ic g_kc
    scale = envelope.view(-1, 1, 1)
    grad_envelope = (products * rotation).sum(dim=(1, 2))
    grad_wigner = _compact_gradient(products * scale, lmax, mmax, wigner.shape[1])
    grad_messages = _blocks(torch.bmm(rotation, at_centre) * scale, lmax, mmax)
    return [*grad_messages, grad_wigner, grad_envelope]


edge_to_nodes_backward = torch.library.custom_op(
    "fastcalc::edge_to_nodes_backward", _torch_to_nodes_backward, mutates_args=()
)


@edge_to_nodes_backward.register_fake
def _(
    grad: Tensor, messages: list[Tensor], wigner: Tensor, envelope: Tensor, centre: Tensor,
    mmax: int,
) -> list[Tensor]:
    return [*(torch.empty_like(m) for m in messages), torch.empty_like(wigner),
            torch.empty_like(envelope)]


def _nodes_setup(ctx: Context, inputs: tuple, output: torch.Tensor) -> None:
    _, messages, wigner, envelope, centre, ctx.mmax = inputs
    ctx.save_for_backward(wigner, envelope, centre, *messages)


def _nodes_backward(ctx: Context, grad: torch.Tensor) -> tuple:
    wigner, envelope, centre, *messages = ctx.saved_tensors
    *grad_messages, grad_wigner, grad_envelope = edge_to_nodes_backward(
        grad.contiguous(), messages, wigner, envelope, centre, ctx.mmax
    )
    return grad, grad_messages, grad_wigner, grad_envelope, None, None


edge_to_nodes.register_autograd(_nodes_backward, setup_context=_nodes_setup)


# ---------------------------------------------------------------- CUDA kernels
# The kernels take at most three blocks (m <= 2, as in every UMA checkpoint); larger
# mmax runs the torch code above, on the GPU.
@edge_pairs.register_kernel("cuda")
def _(*args: Tensor | int | bool) -> list[Tensor]:
    from . import edge_kernels

    if args[-2] > edge_kernels.MAX_ORDER:
        return torch_edge_pairs(*args)
    return edge_kernels.pairs(*args)


@edge_pairs_backward.register_kernel("cuda")
def _(*args: Tensor | int | bool) -> Grads:
    from . import edge_kernels

    if args[-2] > edge_kernels.MAX_ORDER:
        return _torch_pairs_backward(*args)
    return edge_kernels.pairs_backward(*args)


@edge_to_nodes.register_kernel("cuda")
def _(*args: Tensor | int) -> Tensor:
    from . import edge_kernels

    if args[-1] > edge_kernels.MAX_ORDER:
        return torch_edge_to_nodes(*args)
    return edge_kernels.to_nodes(*args)


@edge_to_nodes_backward.register_kernel("cuda")
def _(*args: Tensor | int) -> list[Tensor]:
    from . import edge_kernels

    if args[-1] > edge_kernels.MAX_ORDER:
        return _torch_to_nodes_backward(*args)
    return edge_kernels.to_nodes_backward(*args)
