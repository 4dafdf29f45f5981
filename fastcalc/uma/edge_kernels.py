"""Triton kernels of :mod:`fastcalc.uma.edge_ops` (CUDA; imported only there).

One program handles a few edges and all channels of one side (neighbour or centre)
of each: it gathers the atom's features (K, C) once, rotates them with plain FMAs
(IEEE float32 or float64, never TF32), and writes or accumulates what the operator
asks. Sums over edges into atoms use relaxed atomic adds (no ordering: nothing reads the
sums before the kernel ends), as inductor's ``index_add`` does on CUDA; the
sums over the two signs of m are made in registers and those over the two sides by
the caller. The radial rows and edge-frame components follow the layout of
``edge_ops.radial_rows``, unrolled at compile time.
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

#: Elements of the (edges, components, channels) tile each program holds, and its warps.
TILE = 4096
WARPS = 2


def _block_sizes(components: int, channels: int) -> tuple[int, int, int]:
    padded = triton.next_power_of_2(components)
    block_c = triton.next_power_of_2(channels)
    return padded, block_c, max(1, TILE // (padded * block_c))


def _device(tensor: Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


@triton.jit
def _gathered(x_ptr, src_ptr, side, e, e_ok, k, c, E, C, K: tl.constexpr):
    """The (edges, KP, channels) features of one side's atoms, and where they lie."""
    src = tl.load(src_ptr + side * E + e, mask=e_ok, other=0).to(tl.int64)
    mask = e_ok[:, None, None] & (k < K)[None, :, None] & (c < C)[None, None, :]
    offsets = src[:, None, None] * (K * C) + k[None, :, None] * C + c[None, None, :]
    return tl.load(x_ptr + offsets, mask=mask, other=0.0), offsets, mask


@triton.jit
def _rotated(rot_ptr, x, e, e_ok, k, i: tl.constexpr, M: tl.constexpr, K: tl.constexpr):
    """Row ``i`` of the edge rotations (edges, KP) and the features it makes (edges, C)."""
    r = tl.load(rot_ptr + e[:, None] * (M * K) + i * K + k[None, :],
                mask=e_ok[:, None] & (k < K)[None, :], other=0.0)
    return r, tl.sum(r[:, :, None] * x, axis=1)


@triton.jit
def _order_start(m: tl.constexpr, LMAX: tl.constexpr):
    """Radial rows (also: +m components past the m = 0 ones) before order ``m >= 1``."""
    return (m - 1) * (LMAX + 1) - (m - 1) * m // 2


@triton.jit
def _pairs_kernel(
    x_ptr, rot_ptr, radial_ptr, src_ptr, out_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, M: tl.constexpr, K: tl.constexpr, NR: tl.constexpr,
    KP: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    side = tl.program_id(1)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    k = tl.arange(0, KP)
    c = tl.arange(0, BLOCK_C)
    mask = e_ok[:, None] & (c < C)[None, :]
    x, _, _ = _gathered(x_ptr, src_ptr, side, e, e_ok, k, c, E, C, K)
    radial = radial_ptr + e[:, None] * (NR * 2 * C) + side * C + c[None, :]
    out = out_ptr + e[:, None] * (M * 2 * C) + side * C + c[None, :]
    for l in tl.static_range(LMAX + 1):  # m = 0: component l, radial row l
        scale = tl.load(radial + l * 2 * C, mask=mask, other=0.0)
        _, rotated = _rotated(rot_ptr, x, e, e_ok, k, l, M, K)
        tl.store(out + l * 2 * C, rotated * scale, mask=mask)
    for m in tl.static_range(1, MMAX + 1):  # +m and -m components share a row
        for j in tl.static_range(LMAX - m + 1):
            row = LMAX + 1 + _order_start(m, LMAX) + j
            plus = LMAX + 1 + 2 * _order_start(m, LMAX) + j
            scale = tl.load(radial + row * 2 * C, mask=mask, other=0.0)
            _, rotated = _rotated(rot_ptr, x, e, e_ok, k, plus, M, K)
            tl.store(out + plus * 2 * C, rotated * scale, mask=mask)
            minus = plus + LMAX - m + 1
            _, rotated = _rotated(rot_ptr, x, e, e_ok, k, minus, M, K)
            tl.store(out + minus * 2 * C, rotated * scale, mask=mask)


@triton.jit
def _component_backward(
    grad, rot_ptr, grad_rot, x, scale, e, e_ok, k, mask,
    i: tl.constexpr, M: tl.constexpr, K: tl.constexpr, C,
):
    """Component ``i``'s share of the radial row's gradient and of the features'; stores
    its row of this side's rotation gradient."""
    r, rotated = _rotated(rot_ptr, x, e, e_ok, k, i, M, K)
    g = tl.load(grad + i * 2 * C, mask=mask, other=0.0)
    scaled = g * scale
    tl.store(grad_rot + i * K, tl.sum(scaled[:, None, :] * x, axis=2),
             mask=e_ok[:, None] & (k < K)[None, :])
    return g * rotated, r[:, :, None] * scaled[:, None, :]


@triton.jit
def _pairs_backward_kernel(
    grad_ptr, x_ptr, rot_ptr, radial_ptr, src_ptr,
    grad_x_ptr, grad_rot_ptr, grad_radial_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, M: tl.constexpr, K: tl.constexpr, NR: tl.constexpr,
    KP: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    side = tl.program_id(1)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    k = tl.arange(0, KP)
    c = tl.arange(0, BLOCK_C)
    mask = e_ok[:, None] & (c < C)[None, :]
    x, x_offsets, x_mask = _gathered(x_ptr, src_ptr, side, e, e_ok, k, c, E, C, K)
    grad_x = tl.zeros((BLOCK_E, KP, BLOCK_C), dtype=x.dtype)
    radial = e[:, None] * (NR * 2 * C) + side * C + c[None, :]
    grad = grad_ptr + e[:, None] * (M * 2 * C) + side * C + c[None, :]
    # this side's share of the rotation gradient, in (2, E, M, K): the caller sums the sides
    grad_rot = grad_rot_ptr + side * E * M * K + e[:, None] * (M * K) + k[None, :]
    for l in tl.static_range(LMAX + 1):
        scale = tl.load(radial_ptr + radial + l * 2 * C, mask=mask, other=0.0)
        grad_scale, update = _component_backward(
            grad, rot_ptr, grad_rot, x, scale, e, e_ok, k, mask, l, M, K, C)
        grad_x += update
        tl.store(grad_radial_ptr + radial + l * 2 * C, grad_scale, mask=mask)
    for m in tl.static_range(1, MMAX + 1):
        for j in tl.static_range(LMAX - m + 1):
            row = LMAX + 1 + _order_start(m, LMAX) + j
            plus = LMAX + 1 + 2 * _order_start(m, LMAX) + j
            scale = tl.load(radial_ptr + radial + row * 2 * C, mask=mask, other=0.0)
            grad_plus, update = _component_backward(
                grad, rot_ptr, grad_rot, x, scale, e, e_ok, k, mask, plus, M, K, C)
            grad_x += update
            grad_minus, update = _component_backward(
                grad, rot_ptr, grad_rot, x, scale, e, e_ok, k, mask, plus + LMAX - m + 1, M, K, C)
            grad_x += update
            tl.store(grad_radial_ptr + radial + row * 2 * C, grad_plus + grad_minus, mask=mask)
    tl.atomic_add(grad_x_ptr + x_offsets, grad_x, mask=x_mask, sem="relaxed")


@triton.jit
def _to_nodes_kernel(
    msg_ptr, rot_ptr, env_ptr, centre_ptr, out_ptr,
    E, C,
    M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    i = tl.arange(0, MP)
    c = tl.arange(0, BLOCK_C)
    i_ok = i < M
    c_ok = c < C
    messages = tl.load(
        msg_ptr + e[:, None, None] * (M * C) + i[None, :, None] * C + c[None, None, :],
        mask=e_ok[:, None, None] & i_ok[None, :, None] & c_ok[None, None, :], other=0.0,
    )
    envelope = tl.load(env_ptr + e, mask=e_ok, other=0.0)
    centre = tl.load(centre_ptr + e, mask=e_ok, other=0).to(tl.int64)
    ec_mask = e_ok[:, None] & c_ok[None, :]
    for kk in tl.static_range(K):
        r = tl.load(rot_ptr + e[:, None] * (M * K) + i[None, :] * K + kk,
                    mask=e_ok[:, None] & i_ok[None, :], other=0.0)
        back = tl.sum(r[:, :, None] * messages, axis=1) * envelope[:, None]
        tl.atomic_add(out_ptr + centre[:, None] * (K * C) + kk * C + c[None, :], back, mask=ec_mask,
                      sem="relaxed")


@triton.jit
def _to_nodes_backward_kernel(
    grad_ptr, msg_ptr, rot_ptr, env_ptr, centre_ptr,
    grad_msg_ptr, grad_rot_ptr, grad_env_ptr,
    E, C,
    M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    i = tl.arange(0, MP)
    c = tl.arange(0, BLOCK_C)
    i_ok = i < M
    c_ok = c < C
    msg_offsets = e[:, None, None] * (M * C) + i[None, :, None] * C + c[None, None, :]
    msg_mask = e_ok[:, None, None] & i_ok[None, :, None] & c_ok[None, None, :]
    messages = tl.load(msg_ptr + msg_offsets, mask=msg_mask, other=0.0)
    envelope = tl.load(env_ptr + e, mask=e_ok, other=0.0)
    centre = tl.load(centre_ptr + e, mask=e_ok, other=0).to(tl.int64)
    ec_mask = e_ok[:, None] & c_ok[None, :]
    ei_mask = e_ok[:, None] & i_ok[None, :]
    grad_messages = tl.zeros((BLOCK_E, MP, BLOCK_C), dtype=messages.dtype)
    grad_envelope = tl.zeros((BLOCK_E,), dtype=messages.dtype)
    for kk in tl.static_range(K):
        grad = tl.load(grad_ptr + centre[:, None] * (K * C) + kk * C + c[None, :],
                       mask=ec_mask, other=0.0)
        rot_offsets = e[:, None] * (M * K) + i[None, :] * K + kk
        r = tl.load(rot_ptr + rot_offsets, mask=ei_mask, other=0.0)
        grad_messages += r[:, :, None] * grad[:, None, :]
        products = tl.sum(messages * grad[:, None, :], axis=2)
        tl.store(grad_rot_ptr + rot_offsets, products * envelope[:, None], mask=ei_mask)
        grad_envelope += tl.sum(r * products, axis=1)
    tl.store(grad_msg_ptr + msg_offsets, grad_messages * envelope[:, None, None], mask=msg_mask)
    tl.store(grad_env_ptr + e, grad_envelope, mask=e_ok)


def _layout(x: Tensor, rotation: Tensor, radial: Tensor, mmax: int) -> dict:
    k, channels = x.shape[1], x.shape[2]
    lmax = math.isqrt(k) - 1
    padded, block_c, block_e = _block_sizes(k, channels)
    return dict(
        LMAX=lmax, MMAX=mmax, M=rotation.shape[1], K=k, NR=radial.shape[1] // (2 * channels),
        KP=padded, BLOCK_E=block_e, BLOCK_C=block_c, num_warps=WARPS,
    )


def pairs(x: Tensor, rotation: Tensor, radial: Tensor, neighbour: Tensor, centre: Tensor,
          mmax: int) -> Tensor:
    """:func:`fastcalc.uma.edge_ops.edge_pairs`."""
    x, rotation, radial = x.contiguous(), rotation.contiguous(), radial.contiguous()
    edges, m, _ = rotation.shape
    channels = x.shape[2]
    out = x.new_empty(edges, m, 2 * channels)
    if edges == 0:
        return out
    layout = _layout(x, rotation, radial, mmax)
    with _device(x):
        _pairs_kernel[(triton.cdiv(edges, layout["BLOCK_E"]), 2)](
            x, rotation, radial, torch.stack((neighbour, centre)), out, edges, channels, **layout
        )
    return out


def pairs_backward(grad: Tensor, x: Tensor, rotation: Tensor, radial: Tensor, neighbour: Tensor,
                   centre: Tensor, mmax: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`fastcalc.uma.edge_ops.edge_pairs_backward`."""
    grad, x = grad.contiguous(), x.contiguous()
    rotation, radial = rotation.contiguous(), radial.contiguous()
    edges = rotation.shape[0]
    grad_x = torch.zeros_like(x)
    grad_rotation = rotation.new_empty(2, *rotation.shape)
    grad_radial = torch.empty_like(radial)
    if edges == 0:
        return grad_x, torch.zeros_like(rotation), grad_radial
    layout = _layout(x, rotation, radial, mmax)
    with _device(x):
        _pairs_backward_kernel[(triton.cdiv(edges, layout["BLOCK_E"]), 2)](
            grad, x, rotation, radial, torch.stack((neighbour, centre)),
            grad_x, grad_rotation, grad_radial, edges, x.shape[2], **layout
        )
    return grad_x, grad_rotation.sum(dim=0), grad_radial


def to_nodes(x: Tensor, messages: Tensor, rotation: Tensor, envelope: Tensor,
             centre: Tensor) -> Tensor:
    """:func:`fastcalc.uma.edge_ops.edge_to_nodes`."""
    messages, rotation = messages.contiguous(), rotation.contiguous()
    edges, m, k = rotation.shape
    out = x.clone(memory_format=torch.contiguous_format)
    if edges == 0:
        return out
    padded, block_c, block_e = _block_sizes(m, messages.shape[2])
    with _device(x):
        _to_nodes_kernel[(triton.cdiv(edges, block_e),)](
            messages, rotation, envelope.contiguous(), centre.contiguous(), out,
            edges, messages.shape[2],
            M=m, MP=padded, K=k, BLOCK_E=block_e, BLOCK_C=block_c, num_warps=WARPS,
        )
    return out


def to_nodes_backward(grad: Tensor, messages: Tensor, rotation: Tensor, envelope: Tensor,
                      centre: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`fastcalc.uma.edge_ops.edge_to_nodes_backward`."""
    grad, messages = grad.contiguous(), messages.contiguous()
    rotation, envelope = rotation.contiguous(), envelope.contiguous()
    edges, m, k = rotation.shape
    grad_messages = torch.empty_like(messages)
    grad_rotation = torch.empty_like(rotation)
    grad_envelope = torch.empty_like(envelope)
    if edges == 0:
        return grad_messages, grad_rotation, grad_envelope
    padded, block_c, block_e = _block_sizes(m, messages.shape[2])
    with _device(grad):
        _to_nodes_backward_kernel[(triton.cdiv(edges, block_e),)](
            grad, messages, rotation, envelope, centre.contiguous(), grad_messages, grad_rotation, grad_envelope,
            edges, messages.shape[2],
            M=m, MP=padded, K=k, BLOCK_E=block_e, BLOCK_C=block_c, num_warps=WARPS,
        )
    return grad_messages, grad_rotation, grad_envelope
