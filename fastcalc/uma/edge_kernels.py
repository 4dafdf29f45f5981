"""Triton kernels of :mod:`fastcalc.uma.edge_ops` (CUDA; imported only there).

One program handles a few edges and all channels of one side (neighbour or centre)
of each: it gathers the atom's features (K, C) once, rotates them with plain FMAs
(IEEE float32 or float64, never TF32), and writes or accumulates what the operator
asks. Sums over edges into atoms use atomic adds, as ``index_add`` does on CUDA; sums
over the two sides and the two signs of m (at most two terms into a zeroed buffer)
give the same bits in any order.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl
from torch import Tensor

#: Elements of the (edges, components, channels) tile each program holds, and its warps.
TILE = 4096
WARPS = 4


def _block_sizes(components: int, channels: int) -> tuple[int, int, int]:
    padded = triton.next_power_of_2(components)
    block_c = triton.next_power_of_2(channels)
    return padded, block_c, max(1, TILE // (padded * block_c))


def _device(tensor: Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


@triton.jit
def _pairs_kernel(
    x_ptr, rot_ptr, radial_ptr, src_ptr, rows_ptr, out_ptr,
    E, C, NR,
    M: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    side = tl.program_id(1)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    k = tl.arange(0, KP)
    c = tl.arange(0, BLOCK_C)
    k_ok = k < K
    c_ok = c < C
    src = tl.load(src_ptr + side * E + e, mask=e_ok, other=0).to(tl.int64)
    x_mask = e_ok[:, None, None] & k_ok[None, :, None] & c_ok[None, None, :]
    x = tl.load(
        x_ptr + src[:, None, None] * (K * C) + k[None, :, None] * C + c[None, None, :],
        mask=x_mask, other=0.0,
    )
    width = 2 * C
    ec_mask = e_ok[:, None] & c_ok[None, :]
    for i in tl.static_range(M):
        r = tl.load(rot_ptr + e[:, None] * (M * K) + i * K + k[None, :],
                    mask=e_ok[:, None] & k_ok[None, :], other=0.0)
        rotated = tl.sum(r[:, :, None] * x, axis=1)
        row = tl.load(rows_ptr + i)
        scale = tl.load(radial_ptr + e[:, None] * (NR * width) + row * width + side * C + c[None, :],
                        mask=ec_mask, other=0.0)
        tl.store(out_ptr + e[:, None] * (M * width) + i * width + side * C + c[None, :],
                 rotated * scale, mask=ec_mask)


@triton.jit
def _pairs_backward_kernel(
    grad_ptr, x_ptr, rot_ptr, radial_ptr, src_ptr, rows_ptr,
    grad_x_ptr, grad_rot_ptr, grad_radial_ptr,
    E, C, NR,
    M: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    side = tl.program_id(1)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    k = tl.arange(0, KP)
    c = tl.arange(0, BLOCK_C)
    k_ok = k < K
    c_ok = c < C
    src = tl.load(src_ptr + side * E + e, mask=e_ok, other=0).to(tl.int64)
    x_mask = e_ok[:, None, None] & k_ok[None, :, None] & c_ok[None, None, :]
    x_offsets = src[:, None, None] * (K * C) + k[None, :, None] * C + c[None, None, :]
    x = tl.load(x_ptr + x_offsets, mask=x_mask, other=0.0)
    grad_x = tl.zeros((BLOCK_E, KP, BLOCK_C), dtype=x.dtype)
    width = 2 * C
    ec_mask = e_ok[:, None] & c_ok[None, :]
    ek_mask = e_ok[:, None] & k_ok[None, :]
    for i in tl.static_range(M):
        rot_offsets = e[:, None] * (M * K) + i * K + k[None, :]
        r = tl.load(rot_ptr + rot_offsets, mask=ek_mask, other=0.0)
        rotated = tl.sum(r[:, :, None] * x, axis=1)
        row = tl.load(rows_ptr + i)
        radial_offsets = e[:, None] * (NR * width) + row * width + side * C + c[None, :]
        scale = tl.load(radial_ptr + radial_offsets, mask=ec_mask, other=0.0)
        grad = tl.load(grad_ptr + e[:, None] * (M * width) + i * width + side * C + c[None, :],
                       mask=ec_mask, other=0.0)
        tl.atomic_add(grad_radial_ptr + radial_offsets, grad * rotated, mask=ec_mask)
        scaled = grad * scale
        grad_x += r[:, :, None] * scaled[:, None, :]
        tl.atomic_add(grad_rot_ptr + rot_offsets, tl.sum(scaled[:, None, :] * x, axis=2),
                      mask=ek_mask)
    tl.atomic_add(grad_x_ptr + x_offsets, grad_x, mask=x_mask)


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
        tl.atomic_add(out_ptr + centre[:, None] * (K * C) + kk * C + c[None, :], back, mask=ec_mask)


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


def pairs(x: Tensor, rotation: Tensor, radial: Tensor, neighbour: Tensor, centre: Tensor,
          rows: Tensor) -> Tensor:
    """:func:`fastcalc.uma.edge_ops.edge_pairs`."""
    x, rotation, radial = x.contiguous(), rotation.contiguous(), radial.contiguous()
    edges, m, k = rotation.shape
    channels = x.shape[2]
    out = x.new_empty(edges, m, 2 * channels)
    if edges == 0:
        return out
    padded, block_c, block_e = _block_sizes(k, channels)
    sources = torch.stack((neighbour, centre))
    with _device(x):
        _pairs_kernel[(triton.cdiv(edges, block_e), 2)](
            x, rotation, radial, sources, rows.contiguous(), out,
            edges, channels, radial.shape[1] // (2 * channels),
            M=m, K=k, KP=padded, BLOCK_E=block_e, BLOCK_C=block_c, num_warps=WARPS,
        )
    return out


def pairs_backward(grad: Tensor, x: Tensor, rotation: Tensor, radial: Tensor, neighbour: Tensor,
                   centre: Tensor, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`fastcalc.uma.edge_ops.edge_pairs_backward`."""
    grad, x = grad.contiguous(), x.contiguous()
    rotation, radial = rotation.contiguous(), radial.contiguous()
    edges, m, k = rotation.shape
    channels = x.shape[2]
    grad_x = torch.zeros_like(x)
    grad_rotation = torch.zeros_like(rotation)
    grad_radial = torch.zeros_like(radial)
    if edges == 0:
        return grad_x, grad_rotation, grad_radial
    padded, block_c, block_e = _block_sizes(k, channels)
    sources = torch.stack((neighbour, centre))
    with _device(x):
        _pairs_backward_kernel[(triton.cdiv(edges, block_e), 2)](
            grad, x, rotation, radial, sources, rows.contiguous(), grad_x, grad_rotation, grad_radial,
            edges, channels, radial.shape[1] // (2 * channels),
            M=m, K=k, KP=padded, BLOCK_E=block_e, BLOCK_C=block_c, num_warps=WARPS,
        )
    return grad_x, grad_rotation, grad_radial


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
