"""Triton kernels of :mod:`fastcalc.uma.edge_ops` and :mod:`fastcalc.uma.edge_gate`
(CUDA; imported only there).

The gate kernels are pointwise: one program handles all channels of a few edges and
reads each row of its inputs once. In the rotation kernels, one program handles a few edges and all channels of one side (neighbour or centre) of
each. Each edge's rotation is block-diagonal by degree and arrives compact (E, S): a row
of degree l has 2l + 1 entries, read as one block, and is multiplied only with that
degree's 2l + 1 feature components (padded to ``KB``, the next power of two of
2 lmax + 1), with plain FMAs (IEEE float32 or float64, never TF32). Sums over edges into
atoms use relaxed atomic adds (no ordering: nothing reads the sums before the kernel
ends), as inductor's ``index_add`` does on CUDA; the sums over the two signs of m are
made in registers and those over the two sides by the caller. Edge-frame features come
as one tensor per order m (:func:`fastcalc.uma.edge_ops.order_sizes`; a kernel takes one
pointer per order) and radial rows follow :func:`fastcalc.uma.edge_ops.radial_rows`, all
unrolled at compile time: the +m row of degree l reads block row ``a = l + m`` of its
degree, the -m row ``a = l - m``. With ``THREE`` (compile time too), the edge pairs write
each order m > 0 in three parts (:func:`fastcalc.uma.edge_ops.three_parts`) and the gate
reads the three products of those (:mod:`fastcalc.uma.edge_gate`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .edge_gate import gated_shapes, in_three_parts, input_shapes
from .edge_ops import pairs_shapes

#: Elements of the (edges, KB, channels) tile each program holds, and its warps: one edge
#: per program and one warp was fastest for all four kernels on an H200 (78,000 edges,
#: 128 channels; tiles 512-2048, 1-4 warps; 2 warps at this tile were 1.3-3x slower).
TILE = 1024
WARPS = 1
#: Largest order m the kernels take: one pointer per order's block (every UMA checkpoint
#: has mmax = 2); :mod:`fastcalc.uma.edge_ops` runs its torch code for larger ones.
MAX_ORDER = 2
#: Elements of the (edges, channels) tile of the gate kernels, and their warps: the
#: tile and warps inductor gives pointwise kernels (not tuned on a GPU).
GATE_TILE = 1024
GATE_WARPS = 4


@triton.jit
def _tile(E, C, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's edges (int64) and which of them exist, its channels, and the mask of
    its (edges, channels) tile."""
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    c = tl.arange(0, BLOCK_C)
    return e.to(tl.int64), e_ok, c, e_ok[:, None] & (c < C)[None, :]


@triton.jit
def _order_start(m: tl.constexpr, LMAX: tl.constexpr):
    """Radial rows (also: +m components past the m = 0 ones) before order ``m >= 1``."""
    return (m - 1) * (LMAX + 1) - (m - 1) * m // 2


@triton.jit
def _row(p0, p1, p2, e, m: tl.constexpr, j: tl.constexpr, LMAX: tl.constexpr, W):
    """Pointers (edges, 1) to row ``j`` of the edges' order-``m`` block, given the blocks
    of orders 0, 1 and 2 (each (E, rows, W), :func:`fastcalc.uma.edge_ops.order_sizes`)."""
    if m == 0:
        row = p0 + e[:, None] * ((LMAX + 1) * W) + j * W
    elif m == 1:
        row = p1 + e[:, None] * (2 * LMAX * W) + j * W
    else:
        row = p2 + e[:, None] * (2 * (LMAX - 1) * W) + j * W
    return row


@triton.jit
def _part_row(p1, p2, e, E, m: tl.constexpr, part: tl.constexpr, r: tl.constexpr,
              LMAX: tl.constexpr, W):
    """Pointers (edges, 1) to row ``r`` of part ``part`` of the edges' order-``m`` block in
    three parts (:func:`fastcalc.uma.edge_ops.three_parts`, each (3, E, rows, W)), given
    the blocks of orders 1 and 2."""
    if m == 1:
        row = p1 + (part * E + e[:, None]) * (LMAX * W) + r * W
    else:
        row = p2 + (part * E + e[:, None]) * ((LMAX - 1) * W) + r * W
    return row


@triton.jit
def _signed_row(m: tl.constexpr, l: tl.constexpr, sign: tl.constexpr, LMAX: tl.constexpr):
    """Row of component (l, +m) (``sign`` 0) or (l, -m) (``sign`` 1) in order m's block."""
    return l - m + sign * (LMAX - m + 1)


@triton.jit
def _block_row(l: tl.constexpr, a: tl.constexpr):
    """Offset in a compact rotation of row ``a`` of the degree-``l`` block."""
    return l * (4 * l * l - 1) // 3 + a * (2 * l + 1)


@triton.jit
def _features(x_ptr, src, e_ok, kb, c, C, l: tl.constexpr, K: tl.constexpr):
    """The (edges, KB, channels) degree-``l`` components of the ``src`` atoms' features."""
    mask = e_ok[:, None, None] & (kb < 2 * l + 1)[None, :, None] & (c < C)[None, None, :]
    offsets = src[:, None, None] * (K * C) + (l * l + kb)[None, :, None] * C + c[None, None, :]
    return tl.load(x_ptr + offsets, mask=mask, other=0.0), offsets, mask


@triton.jit
def _rotation_row(w_ptr, e, e_ok, kb, l: tl.constexpr, a: tl.constexpr, S: tl.constexpr):
    """Block row ``a`` of degree ``l`` of the edges' rotations (edges, KB)."""
    return tl.load(w_ptr + e[:, None] * S + _block_row(l, a) + kb[None, :],
                   mask=e_ok[:, None] & (kb < 2 * l + 1)[None, :], other=0.0)


@triton.jit
def _pairs_kernel(
    x_ptr, w_ptr, radial_ptr, src_ptr, out0, out1, out2,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, K: tl.constexpr, S: tl.constexpr,
    NR: tl.constexpr, KB: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
    THREE: tl.constexpr,
):
    side = tl.program_id(1)
    e, e_ok, c, mask = _tile(E, C, BLOCK_E, BLOCK_C)
    kb = tl.arange(0, KB)
    src = tl.load(src_ptr + side * E + e, mask=e_ok, other=0).to(tl.int64)
    radial = radial_ptr + e[:, None] * (NR * 2 * C) + side * C + c[None, :]
    column = side * C + c[None, :]
    for l in tl.static_range(LMAX + 1):
        x, _, _ = _features(x_ptr, src, e_ok, kb, c, C, l, K)
        r = _rotation_row(w_ptr, e, e_ok, kb, l, l, S)  # m = 0: row l, radial row l
        scale = tl.load(radial + l * 2 * C, mask=mask, other=0.0)
        tl.store(_row(out0, out1, out2, e, 0, l, LMAX, 2 * C) + column,
                 tl.sum(r[:, :, None] * x, axis=1) * scale, mask=mask)
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:  # +m and -m rows share a radial row
                scale = tl.load(radial + (LMAX + 1 + _order_start(m, LMAX) + l - m) * 2 * C,
                                mask=mask, other=0.0)
                total = tl.zeros((BLOCK_E, BLOCK_C), dtype=scale.dtype)
                for sign in tl.static_range(2):
                    r = _rotation_row(w_ptr, e, e_ok, kb, l, l + m - 2 * m * sign, S)
                    value = tl.sum(r[:, :, None] * x, axis=1) * scale
                    if THREE:
                        row = _part_row(out1, out2, e, E, m, sign, l - m, LMAX, 2 * C)
                        total += value
                    else:
                        row = _row(out0, out1, out2, e, m, _signed_row(m, l, sign, LMAX), LMAX,
                                   2 * C)
                    tl.store(row + column, value, mask=mask)
                if THREE:
                    tl.store(_part_row(out1, out2, e, E, m, 2, l - m, LMAX, 2 * C) + column,
                             total, mask=mask)


@triton.jit
def _row_backward(g, w_ptr, grad_w, x, scale, e, e_ok, kb, mask,
                  l: tl.constexpr, a: tl.constexpr, S: tl.constexpr):
    """Edge-frame row ``g`` (edges, channels) of the gradient (block row ``a`` of degree
    ``l``): its share of the radial row's gradient (edges, channels) and of the degree's
    feature gradient (edges, KB, channels); stores its block row of this side's rotation
    gradient."""
    r = _rotation_row(w_ptr, e, e_ok, kb, l, a, S)
    scaled = g * scale
    tl.store(grad_w + _block_row(l, a) + kb[None, :], tl.sum(scaled[:, None, :] * x, axis=2),
             mask=e_ok[:, None] & (kb < 2 * l + 1)[None, :])
    return g * tl.sum(r[:, :, None] * x, axis=1), r[:, :, None] * scaled[:, None, :]


@triton.jit
def _pairs_backward_kernel(
    g0, g1, g2, x_ptr, w_ptr, radial_ptr, src_ptr,
    grad_x_ptr, grad_w_ptr, grad_radial_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, K: tl.constexpr, S: tl.constexpr,
    NR: tl.constexpr, KB: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
    THREE: tl.constexpr,
):
    side = tl.program_id(1)
    e, e_ok, c, mask = _tile(E, C, BLOCK_E, BLOCK_C)
    kb = tl.arange(0, KB)
    src = tl.load(src_ptr + side * E + e, mask=e_ok, other=0).to(tl.int64)
    radial = e[:, None] * (NR * 2 * C) + side * C + c[None, :]
    column = side * C + c[None, :]
    # this side's share of the rotation gradient, in (2, E, S): the caller sums the sides
    grad_w = grad_w_ptr + side * E * S + e[:, None] * S
    for l in tl.static_range(LMAX + 1):
        x, x_offsets, x_mask = _features(x_ptr, src, e_ok, kb, c, C, l, K)
        scale = tl.load(radial_ptr + radial + l * 2 * C, mask=mask, other=0.0)
        g = tl.load(_row(g0, g1, g2, e, 0, l, LMAX, 2 * C) + column, mask=mask, other=0.0)
        grad_scale, grad_x = _row_backward(g, w_ptr, grad_w, x, scale, e, e_ok, kb, mask, l,
                                           l, S)
        tl.store(grad_radial_ptr + radial + l * 2 * C, grad_scale, mask=mask)
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:
                radial_row = LMAX + 1 + _order_start(m, LMAX) + l - m
                scale = tl.load(radial_ptr + radial + radial_row * 2 * C, mask=mask, other=0.0)
                grad_scale = tl.zeros((BLOCK_E, BLOCK_C), dtype=scale.dtype)
                if THREE:  # the sum's gradient goes to both rows
                    g_sum = tl.load(_part_row(g1, g2, e, E, m, 2, l - m, LMAX, 2 * C) + column,
                                    mask=mask, other=0.0)
                for sign in tl.static_range(2):
                    if THREE:
                        g = g_sum + tl.load(
                            _part_row(g1, g2, e, E, m, sign, l - m, LMAX, 2 * C) + column,
                            mask=mask, other=0.0)
                    else:
                        g = tl.load(
                            _row(g0, g1, g2, e, m, _signed_row(m, l, sign, LMAX), LMAX, 2 * C)
                            + column, mask=mask, other=0.0)
                    share, update = _row_backward(g, w_ptr, grad_w, x, scale, e, e_ok, kb,
                                                  mask, l, l + m - 2 * m * sign, S)
                    grad_scale += share
                    grad_x += update
                tl.store(grad_radial_ptr + radial + radial_row * 2 * C, grad_scale, mask=mask)
        tl.atomic_add(grad_x_ptr + x_offsets, grad_x, mask=x_mask, sem="relaxed")


@triton.jit
def _to_nodes_kernel(
    msg0, msg1, msg2, w_ptr, env_ptr, centre_ptr, out_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, K: tl.constexpr, S: tl.constexpr,
    KB: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    e, e_ok, c, mask = _tile(E, C, BLOCK_E, BLOCK_C)
    kb = tl.arange(0, KB)
    envelope = tl.load(env_ptr + e, mask=e_ok, other=0.0)
    centre = tl.load(centre_ptr + e, mask=e_ok, other=0).to(tl.int64)
    for l in tl.static_range(LMAX + 1):
        r = _rotation_row(w_ptr, e, e_ok, kb, l, l, S)
        message = tl.load(_row(msg0, msg1, msg2, e, 0, l, LMAX, C) + c[None, :], mask=mask,
                          other=0.0)
        back = r[:, :, None] * message[:, None, :]
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:
                for sign in tl.static_range(2):
                    r = _rotation_row(w_ptr, e, e_ok, kb, l, l + m - 2 * m * sign, S)
                    row = _row(msg0, msg1, msg2, e, m, _signed_row(m, l, sign, LMAX), LMAX, C)
                    back += r[:, :, None] * tl.load(row + c[None, :], mask=mask,
                                                    other=0.0)[:, None, :]
        tl.atomic_add(
            out_ptr + centre[:, None, None] * (K * C) + (l * l + kb)[None, :, None] * C
            + c[None, None, :],
            back * envelope[:, None, None],
            mask=e_ok[:, None, None] & (kb < 2 * l + 1)[None, :, None] & (c < C)[None, None, :],
            sem="relaxed",
        )


@triton.jit
def _to_nodes_row_backward(message_row, grad_message_row, w_ptr, grad_w_ptr, grad, envelope, e,
                           e_ok, kb, mask, l: tl.constexpr, a: tl.constexpr, S: tl.constexpr):
    """An edge-frame row's message and rotation gradients (stored) and its share of the
    envelope's (returned), from the centre's gradient ``grad`` in degree ``l``; the row is
    block row ``a`` of its degree, ``message_row`` and ``grad_message_row`` point to it."""
    r = _rotation_row(w_ptr, e, e_ok, kb, l, a, S)
    message = tl.load(message_row, mask=mask, other=0.0)
    tl.store(grad_message_row, tl.sum(r[:, :, None] * grad, axis=1) * envelope[:, None],
             mask=mask)
    products = tl.sum(message[:, None, :] * grad, axis=2)
    tl.store(grad_w_ptr + e[:, None] * S + _block_row(l, a) + kb[None, :],
             products * envelope[:, None], mask=e_ok[:, None] & (kb < 2 * l + 1)[None, :])
    return tl.sum(r * products, axis=1)


@triton.jit
def _to_nodes_backward_kernel(
    grad_ptr, msg0, msg1, msg2, w_ptr, env_ptr, centre_ptr,
    grad_msg0, grad_msg1, grad_msg2, grad_w_ptr, grad_env_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, K: tl.constexpr, S: tl.constexpr,
    KB: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    e, e_ok, c, mask = _tile(E, C, BLOCK_E, BLOCK_C)
    kb = tl.arange(0, KB)
    envelope = tl.load(env_ptr + e, mask=e_ok, other=0.0)
    centre = tl.load(centre_ptr + e, mask=e_ok, other=0).to(tl.int64)
    grad_envelope = tl.zeros((BLOCK_E,), dtype=envelope.dtype)
    for l in tl.static_range(LMAX + 1):
        grad, _, _ = _features(grad_ptr, centre, e_ok, kb, c, C, l, K)
        grad_envelope += _to_nodes_row_backward(
            _row(msg0, msg1, msg2, e, 0, l, LMAX, C) + c[None, :],
            _row(grad_msg0, grad_msg1, grad_msg2, e, 0, l, LMAX, C) + c[None, :],
            w_ptr, grad_w_ptr, grad, envelope, e, e_ok, kb, mask, l, l, S)
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:
                for sign in tl.static_range(2):
                    j = _signed_row(m, l, sign, LMAX)
                    grad_envelope += _to_nodes_row_backward(
                        _row(msg0, msg1, msg2, e, m, j, LMAX, C) + c[None, :],
                        _row(grad_msg0, grad_msg1, grad_msg2, e, m, j, LMAX, C) + c[None, :],
                        w_ptr, grad_w_ptr, grad, envelope, e, e_ok, kb, mask, l,
                        l + m - 2 * m * sign, S)
    tl.store(grad_env_ptr + e, grad_envelope, mask=e_ok)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _gate_input(first_ptr, in1, in2, e, E, c, mask, m: tl.constexpr, l: tl.constexpr,
                sign: tl.constexpr, LMAX: tl.constexpr, C, THREE: tl.constexpr):
    """Row (l, +m) (``sign`` 0) or (l, -m) (``sign`` 1) of the first convolution's output,
    from its three products' parts ``(t0, t1, t2)`` when ``THREE`` (``t0 - t1``, or
    ``t2 - t0 - t1``)."""
    if THREE:
        t0 = tl.load(_part_row(in1, in2, e, E, m, 0, l - m, LMAX, C) + c[None, :], mask=mask,
                     other=0.0)
        t1 = tl.load(_part_row(in1, in2, e, E, m, 1, l - m, LMAX, C) + c[None, :], mask=mask,
                     other=0.0)
        if sign == 0:
            x = t0 - t1
        else:
            x = tl.load(_part_row(in1, in2, e, E, m, 2, l - m, LMAX, C) + c[None, :],
                        mask=mask, other=0.0) - t0 - t1
    else:
        x = tl.load(_row(first_ptr, in1, in2, e, m, _signed_row(m, l, sign, LMAX), LMAX, C)
                    + c[None, :], mask=mask, other=0.0)
    return x


@triton.jit
def _gate_kernel(
    first_ptr, in1, in2, out0, out1, out2, E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
    THREE: tl.constexpr,
):
    e, e_ok, c, mask = _tile(E, C, BLOCK_E, BLOCK_C)
    first = first_ptr + e[:, None] * ((2 * LMAX + 1) * C) + c[None, :]
    scalar = tl.load(first + LMAX * C, mask=mask, other=0.0)
    tl.store(_row(out0, out1, out2, e, 0, 0, LMAX, C) + c[None, :], scalar * _sigmoid(scalar),
             mask=mask)
    for l in tl.static_range(1, LMAX + 1):
        gate = _sigmoid(tl.load(first + (l - 1) * C, mask=mask, other=0.0))
        tl.store(_row(out0, out1, out2, e, 0, l, LMAX, C) + c[None, :],
                 tl.load(first + (LMAX + l) * C, mask=mask, other=0.0) * gate, mask=mask)
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:
                for sign in tl.static_range(2):
                    x = _gate_input(first_ptr, in1, in2, e, E, c, mask, m, l, sign, LMAX, C,
                                    THREE)
                    tl.store(_row(out0, out1, out2, e, m, _signed_row(m, l, sign, LMAX), LMAX,
                                  C) + c[None, :], x * gate, mask=mask)


@triton.jit
def _gate_backward_kernel(
    g0, g1, g2, first_ptr, z1, z2, grad_first_ptr, grad1, grad2, E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
    THREE: tl.constexpr,
):
    e, e_ok, c, mask = _tile(E, C, BLOCK_E, BLOCK_C)
    rows = e[:, None] * ((2 * LMAX + 1) * C) + c[None, :]
    first, grad_first = first_ptr + rows, grad_first_ptr + rows
    scalar = tl.load(first + LMAX * C, mask=mask, other=0.0)
    sig = _sigmoid(scalar)
    grad = tl.load(_row(g0, g1, g2, e, 0, 0, LMAX, C) + c[None, :], mask=mask, other=0.0)
    tl.store(grad_first + LMAX * C, grad * sig * (1.0 + scalar * (1.0 - sig)), mask=mask)
    for l in tl.static_range(1, LMAX + 1):
        gate = _sigmoid(tl.load(first + (l - 1) * C, mask=mask, other=0.0))
        grad = tl.load(_row(g0, g1, g2, e, 0, l, LMAX, C) + c[None, :], mask=mask, other=0.0)
        tl.store(grad_first + (LMAX + l) * C, grad * gate, mask=mask)
        # the gate's gradient: sum of grad * input over m = 0's row, of grad * output over
        # the others (output = gate * input)
        grad_input = grad * tl.load(first + (LMAX + l) * C, mask=mask, other=0.0)
        grad_output = tl.zeros((BLOCK_E, BLOCK_C), dtype=grad.dtype)
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:
                plus, minus = _signed_row(m, l, 0, LMAX), _signed_row(m, l, 1, LMAX)
                grad_plus = tl.load(_row(g0, g1, g2, e, m, plus, LMAX, C) + c[None, :],
                                    mask=mask, other=0.0)
                grad_minus = tl.load(_row(g0, g1, g2, e, m, minus, LMAX, C) + c[None, :],
                                     mask=mask, other=0.0)
                grad_output += grad_plus * tl.load(
                    _row(first_ptr, z1, z2, e, m, plus, LMAX, C) + c[None, :], mask=mask,
                    other=0.0)
                grad_output += grad_minus * tl.load(
                    _row(first_ptr, z1, z2, e, m, minus, LMAX, C) + c[None, :], mask=mask,
                    other=0.0)
                grad_plus, grad_minus = grad_plus * gate, grad_minus * gate
                if THREE:  # through y+ = t0 - t1 and y- = t2 - t0 - t1
                    tl.store(_part_row(grad1, grad2, e, E, m, 0, l - m, LMAX, C) + c[None, :],
                             grad_plus - grad_minus, mask=mask)
                    tl.store(_part_row(grad1, grad2, e, E, m, 1, l - m, LMAX, C) + c[None, :],
                             -grad_plus - grad_minus, mask=mask)
                    tl.store(_part_row(grad1, grad2, e, E, m, 2, l - m, LMAX, C) + c[None, :],
                             grad_minus, mask=mask)
                else:
                    tl.store(_row(grad_first_ptr, grad1, grad2, e, m, plus, LMAX, C)
                             + c[None, :], grad_plus, mask=mask)
                    tl.store(_row(grad_first_ptr, grad1, grad2, e, m, minus, LMAX, C)
                             + c[None, :], grad_minus, mask=mask)
        tl.store(grad_first + (l - 1) * C,
                 (grad_input * gate + grad_output) * (1.0 - gate), mask=mask)


def _layout(node_like: Tensor, wigner: Tensor, mmax: int) -> dict:
    """Compile-time sizes and the tile for node features like ``node_like`` (N, K, C)."""
    k, channels = node_like.shape[1], node_like.shape[2]
    lmax = math.isqrt(k) - 1
    degree_block = triton.next_power_of_2(2 * lmax + 1)
    block_c = triton.next_power_of_2(channels)
    return dict(
        LMAX=lmax, MMAX=mmax, K=k, S=wigner.shape[1], KB=degree_block,
        BLOCK_E=max(1, TILE // (degree_block * block_c)), BLOCK_C=block_c, num_warps=WARPS,
    )


def _by_order(blocks: list[Tensor]) -> list[Tensor]:
    """The blocks of orders 0, 1 and 2, the last repeated where mmax < 2 (never read)."""
    return [*blocks, *blocks[-1:] * (MAX_ORDER + 1 - len(blocks))]


def pairs(x: Tensor, wigner: Tensor, radial: Tensor, neighbour: Tensor, centre: Tensor,
          mmax: int, three: bool) -> list[Tensor]:
    """:func:`fastcalc.uma.edge_ops.edge_pairs`."""
    x, wigner, radial = x.contiguous(), wigner.contiguous(), radial.contiguous()
    edges, channels = wigner.shape[0], x.shape[2]
    out = [x.new_empty(shape) for shape in pairs_shapes(x, wigner, mmax, three)]
    if edges == 0:
        return out
    layout = _layout(x, wigner, mmax)
    layout.update(NR=radial.shape[1] // (2 * channels), THREE=three)
    with torch.cuda.device_of(x):
        _pairs_kernel[(triton.cdiv(edges, layout["BLOCK_E"]), 2)](
            x, wigner, radial, torch.stack((neighbour, centre)), *_by_order(out), edges, channels,
            **layout
        )
    return out


def pairs_backward(grads: list[Tensor], x: Tensor, wigner: Tensor, radial: Tensor,
                   neighbour: Tensor, centre: Tensor, mmax: int,
                   three: bool) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`fastcalc.uma.edge_ops.edge_pairs_backward`."""
    grads, x = [g.contiguous() for g in grads], x.contiguous()
    wigner, radial = wigner.contiguous(), radial.contiguous()
    edges, channels = wigner.shape[0], x.shape[2]
    grad_x = torch.zeros_like(x)
    # rows with |m| > mmax are never written: their entries' gradient is zero
    grad_wigner = wigner.new_zeros(2, *wigner.shape)
    grad_radial = torch.empty_like(radial)
    if edges == 0:
        return grad_x, grad_wigner.sum(dim=0), grad_radial
    layout = _layout(x, wigner, mmax)
    layout.update(NR=radial.shape[1] // (2 * channels), THREE=three)
    with torch.cuda.device_of(x):
        _pairs_backward_kernel[(triton.cdiv(edges, layout["BLOCK_E"]), 2)](
            *_by_order(grads), x, wigner, radial, torch.stack((neighbour, centre)),
            grad_x, grad_wigner, grad_radial, edges, channels, **layout
        )
    return grad_x, grad_wigner.sum(dim=0), grad_radial


def to_nodes(x: Tensor, messages: list[Tensor], wigner: Tensor, envelope: Tensor, centre: Tensor,
             mmax: int) -> Tensor:
    """:func:`fastcalc.uma.edge_ops.edge_to_nodes`."""
    messages, wigner = [m.contiguous() for m in messages], wigner.contiguous()
    edges = wigner.shape[0]
    out = x.clone(memory_format=torch.contiguous_format)
    if edges == 0:
        return out
    with torch.cuda.device_of(x):
        layout = _layout(x, wigner, mmax)
        _to_nodes_kernel[(triton.cdiv(edges, layout["BLOCK_E"]),)](
            *_by_order(messages), wigner, envelope.contiguous(), centre.contiguous(), out,
            edges, x.shape[2], **layout
        )
    return out


def to_nodes_backward(grad: Tensor, messages: list[Tensor], wigner: Tensor, envelope: Tensor,
                      centre: Tensor, mmax: int) -> list[Tensor]:
    """:func:`fastcalc.uma.edge_ops.edge_to_nodes_backward`."""
    grad, messages = grad.contiguous(), [m.contiguous() for m in messages]
    wigner, envelope = wigner.contiguous(), envelope.contiguous()
    edges = wigner.shape[0]
    grad_messages = [torch.empty_like(m) for m in messages]
    grad_wigner = torch.zeros_like(wigner)  # rows with |m| > mmax are never written
    grad_envelope = torch.empty_like(envelope)
    if edges > 0:
        with torch.cuda.device_of(grad):
            layout = _layout(grad, wigner, mmax)
            _to_nodes_backward_kernel[(triton.cdiv(edges, layout["BLOCK_E"]),)](
                grad, *_by_order(messages), wigner, envelope, centre.contiguous(),
                *_by_order(grad_messages), grad_wigner, grad_envelope, edges, grad.shape[2],
                **layout
            )
    return [*grad_messages, grad_wigner, grad_envelope]


def _gate_layout(channels: int, mmax: int, lmax: int, three: bool) -> dict:
    """Compile-time sizes and the tile of the gate kernels (all channels of GATE_TILE //
    channels edges a program)."""
    block_c = triton.next_power_of_2(channels)
    return dict(LMAX=lmax, MMAX=mmax, BLOCK_E=max(1, GATE_TILE // block_c),
                BLOCK_C=block_c, num_warps=GATE_WARPS, THREE=three)


def gate(first: Tensor, others: list[Tensor], lmax: int) -> list[Tensor]:
    """:func:`fastcalc.uma.edge_gate.edge_gate`."""
    first, others = first.contiguous(), [block.contiguous() for block in others]
    edges, channels = first.shape[0], first.shape[1] // (2 * lmax + 1)
    out = [first.new_empty(edges, (lmax + 1) * channels),
           *(first.new_empty(shape) for shape in gated_shapes(others))]
    if edges > 0:
        layout = _gate_layout(channels, len(others), lmax, in_three_parts(others))
        with torch.cuda.device_of(first):
            _gate_kernel[(triton.cdiv(edges, layout["BLOCK_E"]),)](
                first, *_by_order([first, *others])[1:], *_by_order(out), edges, channels, **layout
            )
    return out


def gate_backward(grads: list[Tensor], first: Tensor, gated: list[Tensor], lmax: int,
                  three: bool) -> list[Tensor]:
    """Gradients of :func:`fastcalc.uma.edge_gate.edge_gate` (its backward operator)."""
    grads, first = [g.contiguous() for g in grads], first.contiguous()
    gated = [block.contiguous() for block in gated]
    edges, channels = first.shape[0], first.shape[1] // (2 * lmax + 1)
    grad_first = torch.empty_like(first)
    grad_others = [first.new_empty(shape) for shape in input_shapes(gated, three)]
    if edges > 0:
        layout = _gate_layout(channels, len(gated), lmax, three)
        with torch.cuda.device_of(first):
            _gate_backward_kernel[(triton.cdiv(edges, layout["BLOCK_E"]),)](
                *_by_order(grads), first, *_by_order([first, *gated])[1:], grad_first,
                *_by_order([grad_first, *grad_others])[1:], edges, channels, **layout
            )
    return [grad_first, *grad_others]
