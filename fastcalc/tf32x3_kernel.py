"""A Triton matrix product of float32 matrices as three TF32 tensor-core products (CUDA;
imported only by :mod:`fastcalc.precision`).

Each operand is split into a TF32 part and the TF32 part of what is left
(``a = a_hi + a_lo``), and ``a @ b`` is summed as ``a_hi @ b_hi + a_hi @ b_lo + a_lo @ b_hi``
in float32 (Triton's ``input_precision="tf32x3"``): close to IEEE float32 (the dropped
``a_lo @ b_lo`` is below float32's rounding), on tensor cores. Used for the network's
large products, whose float32 form runs on the GPU's slower SIMT units.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

#: Tiles tried for each (N, K) the first time it is met (timed once per process).
CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32}, num_warps=8, num_stages=3),
]


@triton.autotune(configs=CONFIGS, key=["N", "K"])
@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # consecutive programs share a row block of ``a`` (N is a few tiles wide at most)
    tiles_n = tl.cdiv(N, BLOCK_N)
    row = (tl.program_id(0) // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    col = (tl.program_id(0) % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    row_ok, col_ok = row < M, col < N
    row = row.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + inner
        a = tl.load(a_ptr + row[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=row_ok[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + col[None, :] * stride_bn,
                    mask=(k < K)[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision="tf32x3")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + col, mask=col_ok, other=0.0)[None, :]
    tl.store(c_ptr + row[:, None] * stride_cm + col[None, :] * stride_cn, acc,
             mask=row_ok[:, None] & col_ok[None, :])


def matmul(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """``a @ b (+ bias)`` for float32 matrices ``a`` (M, K) and ``b`` (K, N), any strides,
    and a contiguous ``bias`` (N,), added in the same kernel."""
    return _launch(_matmul_kernel, a, b, bias)


def _launch(kernel, a: Tensor, b: Tensor, bias: Tensor | None, **tile: int) -> Tensor:
    """:func:`matmul` by ``kernel``: the autotuned kernel, or its function (``.fn``) with a
    fixed ``tile`` (as the tests run it in Triton's interpreter, where nothing is timed)."""
    m, k = a.shape
    n = b.shape[1]
    out = a.new_empty((m, n))
    if out.numel() == 0:
        return out

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    with torch.cuda.device_of(a):
        kernel[grid](a, b, out if bias is None else bias, out, m, n, k, a.stride(0),
                     a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
                     HAS_BIAS=bias is not None, **tile)
    return out
