"""UMA's edge operators on CUDA: the Triton kernels against the same work in torch, per tile.

Random operands of one layer of the UMA-S-shaped benchmark (1008 Cu atoms, about 78
neighbours each: 78,000 edges, 128 channels, lmax = mmax = 2). Prints the median time
of each operator and its backward pass in torch (eager, on CUDA) and, for each tile
size and warp count of :mod:`fastcalc.uma.edge_kernels`, in the kernels, with their
largest difference from torch relative to its largest value.

It also times candidates not yet used by fastcalc, marked "(blocks)": the same four kernels
working on each edge rotation's blocks by degree (a row of degree l has 2l + 1 non-zero
columns: 35 of 81 entries for lmax 2), so that they multiply and hold less (see
``benchmarks/kernel_registers.py`` for their registers), checked against torch on
block-diagonal rotations.

    python benchmarks/edge_kernels.py --edges 78000 --tiles 1024 2048 4096 --warps 1 2 4

On a machine without a GPU, Triton's interpreter checks the kernels' numbers (slowly):

    TRITON_INTERPRET=1 python benchmarks/edge_kernels.py --device cpu --atoms 12 --edges 200 --tiles 4096 --warps 2 --calls 1
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from fastcalc.bench.timing import synchronize  # noqa: E402
from fastcalc.uma import edge_kernels  # noqa: E402
from fastcalc.uma.edge_kernels import _order_start  # noqa: E402
from fastcalc.uma.edge_ops import radial_rows  # noqa: E402


def median_ms(fn: Callable[[], object], calls: int = 20) -> float:
    fn()
    times = []
    for _ in range(calls):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


# ---------------------------------------------------------------- candidate: degree blocks
# Each edge's rotation is block-diagonal by degree: a row of degree l has 2l + 1 non-zero
# columns, 35 of 81 for lmax 2. fastcalc's kernels multiply every row by all K columns,
# padded to 16; these multiply each degree's rows by that degree's columns only, padded to
# KB = next power of two of 2 lmax + 1 (8 for lmax 2), and take the rotation's entries
# outside the blocks as zero (their gradient is written as zero).


@triton.jit
def _degree_features(x_ptr, src, e_ok, kb, c, C, base, D: tl.constexpr, K: tl.constexpr):
    """The (edges, KB, channels) features of one degree's columns ``base .. base + D``."""
    mask = e_ok[:, None, None] & (kb < D)[None, :, None] & (c < C)[None, None, :]
    offsets = src[:, None, None] * (K * C) + (base + kb)[None, :, None] * C + c[None, None, :]
    return tl.load(x_ptr + offsets, mask=mask, other=0.0), offsets, mask


@triton.jit
def _degree_row(rot_ptr, xb, e, e_ok, kb, base, i: tl.constexpr, D: tl.constexpr,
                M: tl.constexpr, K: tl.constexpr):
    """Row ``i``'s entries in its degree's columns (edges, KB), and the features it makes."""
    r = tl.load(rot_ptr + e[:, None] * (M * K) + i * K + base + kb[None, :],
                mask=e_ok[:, None] & (kb < D)[None, :], other=0.0)
    return r, tl.sum(r[:, :, None] * xb, axis=1)


@triton.jit
def _pairs_blocked_kernel(
    x_ptr, rot_ptr, radial_ptr, src_ptr, out_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, M: tl.constexpr, K: tl.constexpr, NR: tl.constexpr,
    KB: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    side = tl.program_id(1)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    kb = tl.arange(0, KB)
    c = tl.arange(0, BLOCK_C)
    mask = e_ok[:, None] & (c < C)[None, :]
    src = tl.load(src_ptr + side * E + e, mask=e_ok, other=0).to(tl.int64)
    radial = radial_ptr + e[:, None] * (NR * 2 * C) + side * C + c[None, :]
    out = out_ptr + e[:, None] * (M * 2 * C) + side * C + c[None, :]
    for l in tl.static_range(LMAX + 1):
        xb, _, _ = _degree_features(x_ptr, src, e_ok, kb, c, C, l * l, 2 * l + 1, K)
        scale = tl.load(radial + l * 2 * C, mask=mask, other=0.0)  # m = 0: row l
        _, rotated = _degree_row(rot_ptr, xb, e, e_ok, kb, l * l, l, 2 * l + 1, M, K)
        tl.store(out + l * 2 * C, rotated * scale, mask=mask)
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:
                row = LMAX + 1 + _order_start(m, LMAX) + l - m
                plus = LMAX + 1 + 2 * _order_start(m, LMAX) + l - m
                minus = plus + LMAX - m + 1
                scale = tl.load(radial + row * 2 * C, mask=mask, other=0.0)
                _, rotated = _degree_row(rot_ptr, xb, e, e_ok, kb, l * l, plus, 2 * l + 1, M, K)
                tl.store(out + plus * 2 * C, rotated * scale, mask=mask)
                _, rotated = _degree_row(rot_ptr, xb, e, e_ok, kb, l * l, minus, 2 * l + 1, M, K)
                tl.store(out + minus * 2 * C, rotated * scale, mask=mask)


@triton.jit
def _degree_row_backward(grad, rot_ptr, grad_rot, xb, scale, e, e_ok, kb, mask, base,
                         i: tl.constexpr, D: tl.constexpr, M: tl.constexpr, K: tl.constexpr,
                         C):
    """Row ``i``'s share of its radial row's gradient and of its degree's feature gradient
    (edges, KB, channels); stores its block of this side's rotation gradient."""
    r, rotated = _degree_row(rot_ptr, xb, e, e_ok, kb, base, i, D, M, K)
    g = tl.load(grad + i * 2 * C, mask=mask, other=0.0)
    scaled = g * scale
    tl.store(grad_rot + i * K + base + kb[None, :], tl.sum(scaled[:, None, :] * xb, axis=2),
             mask=e_ok[:, None] & (kb < D)[None, :])
    return g * rotated, r[:, :, None] * scaled[:, None, :]


@triton.jit
def _pairs_backward_blocked_kernel(
    grad_ptr, x_ptr, rot_ptr, radial_ptr, src_ptr,
    grad_x_ptr, grad_rot_ptr, grad_radial_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, M: tl.constexpr, K: tl.constexpr, NR: tl.constexpr,
    KB: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    side = tl.program_id(1)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    kb = tl.arange(0, KB)
    c = tl.arange(0, BLOCK_C)
    mask = e_ok[:, None] & (c < C)[None, :]
    src = tl.load(src_ptr + side * E + e, mask=e_ok, other=0).to(tl.int64)
    radial = e[:, None] * (NR * 2 * C) + side * C + c[None, :]
    grad = grad_ptr + e[:, None] * (M * 2 * C) + side * C + c[None, :]
    grad_rot = grad_rot_ptr + side * E * M * K + e[:, None] * (M * K)
    for l in tl.static_range(LMAX + 1):
        xb, x_offsets, x_mask = _degree_features(x_ptr, src, e_ok, kb, c, C, l * l, 2 * l + 1, K)
        scale = tl.load(radial_ptr + radial + l * 2 * C, mask=mask, other=0.0)
        grad_scale, grad_x = _degree_row_backward(
            grad, rot_ptr, grad_rot, xb, scale, e, e_ok, kb, mask, l * l, l, 2 * l + 1, M, K, C)
        tl.store(grad_radial_ptr + radial + l * 2 * C, grad_scale, mask=mask)
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:
                row = LMAX + 1 + _order_start(m, LMAX) + l - m
                plus = LMAX + 1 + 2 * _order_start(m, LMAX) + l - m
                scale = tl.load(radial_ptr + radial + row * 2 * C, mask=mask, other=0.0)
                grad_plus, update = _degree_row_backward(
                    grad, rot_ptr, grad_rot, xb, scale, e, e_ok, kb, mask, l * l, plus, 2 * l + 1,
                    M, K, C)
                grad_x += update
                grad_minus, update = _degree_row_backward(
                    grad, rot_ptr, grad_rot, xb, scale, e, e_ok, kb, mask, l * l,
                    plus + LMAX - m + 1, 2 * l + 1, M, K, C)
                grad_x += update
                tl.store(grad_radial_ptr + radial + row * 2 * C, grad_plus + grad_minus,
                         mask=mask)
        tl.atomic_add(grad_x_ptr + x_offsets, grad_x, mask=x_mask, sem="relaxed")


@triton.jit
def _to_nodes_blocked_kernel(
    msg_ptr, rot_ptr, env_ptr, centre_ptr, out_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, M: tl.constexpr, K: tl.constexpr,
    KB: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    kb = tl.arange(0, KB)
    c = tl.arange(0, BLOCK_C)
    mask = e_ok[:, None] & (c < C)[None, :]
    envelope = tl.load(env_ptr + e, mask=e_ok, other=0.0)
    centre = tl.load(centre_ptr + e, mask=e_ok, other=0).to(tl.int64)
    messages = msg_ptr + e[:, None] * (M * C) + c[None, :]
    for l in tl.static_range(LMAX + 1):
        r = tl.load(rot_ptr + e[:, None] * (M * K) + l * K + l * l + kb[None, :],
                    mask=e_ok[:, None] & (kb < 2 * l + 1)[None, :], other=0.0)
        back = r[:, :, None] * tl.load(messages + l * C, mask=mask, other=0.0)[:, None, :]
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:
                plus = LMAX + 1 + 2 * _order_start(m, LMAX) + l - m
                for i in tl.static_range(2):
                    row = plus + i * (LMAX - m + 1)
                    r = tl.load(rot_ptr + e[:, None] * (M * K) + row * K + l * l + kb[None, :],
                                mask=e_ok[:, None] & (kb < 2 * l + 1)[None, :], other=0.0)
                    message = tl.load(messages + row * C, mask=mask, other=0.0)
                    back += r[:, :, None] * message[:, None, :]
        tl.atomic_add(
            out_ptr + centre[:, None, None] * (K * C) + (l * l + kb)[None, :, None] * C
            + c[None, None, :],
            back * envelope[:, None, None],
            mask=e_ok[:, None, None] & (kb < 2 * l + 1)[None, :, None] & (c < C)[None, None, :],
            sem="relaxed",
        )


@triton.jit
def _to_nodes_row_backward(msg_ptr, rot_ptr, grad_msg_ptr, grad_rot_ptr, gb, envelope, e, e_ok,
                           kb, c, mask, base, i: tl.constexpr, D: tl.constexpr,
                           M: tl.constexpr, K: tl.constexpr, C):
    """Row ``i``'s message and rotation gradients (stored) and its share of the
    envelope's (returned), from the centre's gradient ``gb`` in the row's degree columns."""
    r = tl.load(rot_ptr + e[:, None] * (M * K) + i * K + base + kb[None, :],
                mask=e_ok[:, None] & (kb < D)[None, :], other=0.0)
    message = tl.load(msg_ptr + e[:, None] * (M * C) + i * C + c[None, :], mask=mask, other=0.0)
    tl.store(grad_msg_ptr + e[:, None] * (M * C) + i * C + c[None, :],
             tl.sum(r[:, :, None] * gb, axis=1) * envelope[:, None], mask=mask)
    products = tl.sum(message[:, None, :] * gb, axis=2)
    tl.store(grad_rot_ptr + e[:, None] * (M * K) + i * K + base + kb[None, :],
             products * envelope[:, None], mask=e_ok[:, None] & (kb < D)[None, :])
    return tl.sum(r * products, axis=1)


@triton.jit
def _to_nodes_backward_blocked_kernel(
    grad_ptr, msg_ptr, rot_ptr, env_ptr, centre_ptr,
    grad_msg_ptr, grad_rot_ptr, grad_env_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, M: tl.constexpr, K: tl.constexpr,
    KB: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    e = e.to(tl.int64)
    kb = tl.arange(0, KB)
    c = tl.arange(0, BLOCK_C)
    mask = e_ok[:, None] & (c < C)[None, :]
    envelope = tl.load(env_ptr + e, mask=e_ok, other=0.0)
    centre = tl.load(centre_ptr + e, mask=e_ok, other=0).to(tl.int64)
    grad_envelope = tl.zeros((BLOCK_E,), dtype=envelope.dtype)
    for l in tl.static_range(LMAX + 1):
        gb = tl.load(
            grad_ptr + centre[:, None, None] * (K * C) + (l * l + kb)[None, :, None] * C
            + c[None, None, :],
            mask=e_ok[:, None, None] & (kb < 2 * l + 1)[None, :, None] & (c < C)[None, None, :],
            other=0.0,
        )
        grad_envelope += _to_nodes_row_backward(
            msg_ptr, rot_ptr, grad_msg_ptr, grad_rot_ptr, gb, envelope, e, e_ok, kb, c, mask,
            l * l, l, 2 * l + 1, M, K, C)
        for m in tl.static_range(1, MMAX + 1):
            if m <= l:
                plus = LMAX + 1 + 2 * _order_start(m, LMAX) + l - m
                for i in tl.static_range(2):
                    grad_envelope += _to_nodes_row_backward(
                        msg_ptr, rot_ptr, grad_msg_ptr, grad_rot_ptr, gb, envelope, e, e_ok, kb,
                        c, mask, l * l, plus + i * (LMAX - m + 1), 2 * l + 1, M, K, C)
    tl.store(grad_env_ptr + e, grad_envelope, mask=e_ok)


def _blocked_layout(rotation, channels, mmax):
    """Compile-time sizes and tile of the "(blocks)" kernels for rotations (E, M, K)."""
    _, m, k = rotation.shape
    lmax = math.isqrt(k) - 1
    degree_block = triton.next_power_of_2(2 * lmax + 1)
    block_c = triton.next_power_of_2(channels)
    return dict(
        LMAX=lmax, MMAX=mmax, M=m, K=k, KB=degree_block,
        BLOCK_E=max(1, edge_kernels.TILE // (degree_block * block_c)), BLOCK_C=block_c,
        num_warps=edge_kernels.WARPS,
    )


def pairs_blocked(x, rotation, radial, neighbour, centre, mmax):
    """Candidate for ``edge_kernels.pairs``: degree blocks (see above)."""
    edges, m, _ = rotation.shape
    out = x.new_empty(edges, m, 2 * x.shape[2])
    layout = _blocked_layout(rotation, x.shape[2], mmax)
    layout["NR"] = radial.shape[1] // (2 * x.shape[2])
    _pairs_blocked_kernel[(triton.cdiv(edges, layout["BLOCK_E"]), 2)](
        x, rotation, radial, torch.stack((neighbour, centre)), out, edges, x.shape[2], **layout
    )
    return out


def pairs_backward_blocked(grad, x, rotation, radial, neighbour, centre, mmax):
    """Candidate for ``edge_kernels.pairs_backward``: degree blocks (see above)."""
    edges = rotation.shape[0]
    grad_x = torch.zeros_like(x)
    grad_rotation = rotation.new_zeros(2, *rotation.shape)
    grad_radial = torch.empty_like(radial)
    layout = _blocked_layout(rotation, x.shape[2], mmax)
    layout["NR"] = radial.shape[1] // (2 * x.shape[2])
    _pairs_backward_blocked_kernel[(triton.cdiv(edges, layout["BLOCK_E"]), 2)](
        grad, x, rotation, radial, torch.stack((neighbour, centre)),
        grad_x, grad_rotation, grad_radial, edges, x.shape[2], **layout
    )
    return grad_x, grad_rotation.sum(dim=0), grad_radial


def to_nodes_blocked(x, messages, rotation, envelope, centre, mmax):
    """Candidate for ``edge_kernels.to_nodes``: degree blocks (see above)."""
    out = x.clone()
    layout = _blocked_layout(rotation, messages.shape[2], mmax)
    _to_nodes_blocked_kernel[(triton.cdiv(rotation.shape[0], layout["BLOCK_E"]),)](
        messages, rotation, envelope, centre, out, rotation.shape[0], messages.shape[2], **layout
    )
    return out


def to_nodes_backward_blocked(grad, messages, rotation, envelope, centre, mmax):
    """Candidate for ``edge_kernels.to_nodes_backward``: degree blocks (see above)."""
    grad_messages = torch.empty_like(messages)
    grad_rotation = torch.zeros_like(rotation)
    grad_envelope = torch.empty_like(envelope)
    layout = _blocked_layout(rotation, messages.shape[2], mmax)
    _to_nodes_backward_blocked_kernel[(triton.cdiv(rotation.shape[0], layout["BLOCK_E"]),)](
        grad, messages, rotation, envelope, centre, grad_messages, grad_rotation, grad_envelope,
        rotation.shape[0], messages.shape[2], **layout
    )
    return grad_messages, grad_rotation, grad_envelope


def row_degrees(lmax: int, mmax: int) -> list[int]:
    """Degree of each edge-frame row (m = 0 rows, then each m's +m and -m rows)."""
    degrees = list(range(lmax + 1))
    for m in range(1, mmax + 1):
        degrees += 2 * list(range(m, lmax + 1))
    return degrees


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=1008)
    parser.add_argument("--edges", type=int, default=78000)
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--tiles", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    cuda = dict(device=args.device)
    lmax = mmax = 2
    rows = torch.tensor(radial_rows(lmax, mmax), **cuda)
    n, e, c, k, m = args.atoms, args.edges, args.channels, (lmax + 1) ** 2, len(rows)
    x = torch.randn(n, k, c, **cuda)
    rotation = torch.randn(e, m, k, **cuda)
    radial = torch.randn(e, (int(rows.max()) + 1) * 2 * c, **cuda)
    neighbour = torch.randint(0, n, (e,), **cuda)
    centre = torch.randint(0, n, (e,), **cuda).sort().values
    messages = torch.randn(e, m, c, **cuda)
    envelope = torch.rand(e, **cuda)
    grad_pairs = torch.randn(e, m, 2 * c, **cuda)
    grad_nodes = torch.randn(n, k, c, **cuda)

    def torch_pairs(x=x, rotation=rotation, radial=radial):
        pairs = torch.cat((rotation @ x[neighbour], rotation @ x[centre]), dim=2)
        return pairs * radial.view(e, -1, 2 * c)[:, rows]

    def torch_nodes(x=x, messages=messages, rotation=rotation, envelope=envelope):
        return x.index_add(0, centre, rotation.mT @ messages * envelope.view(-1, 1, 1))

    def torch_backward(fn, inputs, grad):
        leaves = [t.clone().requires_grad_() for t in inputs]
        return torch.autograd.grad(fn(*leaves), leaves, grad)

    pairs_inputs = (x, rotation, radial)
    nodes_inputs = (x, messages, rotation, envelope)
    expected = [
        torch_pairs(),
        *torch_backward(torch_pairs, pairs_inputs, grad_pairs),
        torch_nodes(),
        *torch_backward(torch_nodes, nodes_inputs, grad_nodes)[1:],
    ]
    print(
        "torch: pairs %.3f ms, pairs forward and backward %.3f, nodes %.3f, nodes forward "
        "and backward %.3f" % (
            median_ms(torch_pairs, args.calls),
            median_ms(lambda: torch_backward(torch_pairs, pairs_inputs, grad_pairs), args.calls),
            median_ms(torch_nodes, args.calls),
            median_ms(lambda: torch_backward(torch_nodes, nodes_inputs, grad_nodes), args.calls),
        )
    )
    kernels = {
        "pairs": lambda: edge_kernels.pairs(x, rotation, radial, neighbour, centre, mmax),
        "pairs backward": lambda: edge_kernels.pairs_backward(
            grad_pairs, x, rotation, radial, neighbour, centre, mmax
        ),
        "nodes": lambda: edge_kernels.to_nodes(x, messages, rotation, envelope, centre),
        "nodes backward": lambda: edge_kernels.to_nodes_backward(
            grad_nodes, messages, rotation, envelope, centre
        ),
    }
    columns = torch.tensor([math.isqrt(i) for i in range(k)], **cuda)
    in_blocks = torch.tensor(row_degrees(lmax, mmax), **cuda)[:, None] == columns[None, :]
    blocked = rotation * in_blocks
    blocked_expected = [
        torch_pairs(rotation=blocked),
        *torch_backward(torch_pairs, (x, blocked, radial), grad_pairs),
    ]
    blocked_expected[2] = blocked_expected[2] * in_blocks
    blocked_expected += [
        torch_nodes(rotation=blocked),
        *torch_backward(torch_nodes, (x, messages, blocked, envelope), grad_nodes)[1:],
    ]
    blocked_expected[6] = blocked_expected[6] * in_blocks
    candidates = {
        "pairs (blocks)": lambda: pairs_blocked(x, blocked, radial, neighbour, centre, mmax),
        "pairs backward (blocks)": lambda: pairs_backward_blocked(
            grad_pairs, x, blocked, radial, neighbour, centre, mmax
        ),
        "nodes (blocks)": lambda: to_nodes_blocked(x, messages, blocked, envelope, centre, mmax),
        "nodes backward (blocks)": lambda: to_nodes_backward_blocked(
            grad_nodes, messages, blocked, envelope, centre, mmax
        ),
    }
    for tile in args.tiles:
        for warps in args.warps:
            edge_kernels.TILE, edge_kernels.WARPS = tile, warps
            got = [kernels["pairs"](), *kernels["pairs backward"](), kernels["nodes"](),
                   *kernels["nodes backward"]()]
            error = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, expected))
            blocked_got = [candidates["pairs (blocks)"](), *candidates["pairs backward (blocks)"](),
                           candidates["nodes (blocks)"](), *candidates["nodes backward (blocks)"]()]
            blocked_error = max(float((a - b).abs().max() / b.abs().max())
                                for a, b in zip(blocked_got, blocked_expected))
            times = ", ".join(f"{name} {median_ms(fn, args.calls):.3f}"
                              for name, fn in {**kernels, **candidates}.items())
            print(f"tile {tile}, {warps} warps: {times} ms; largest relative difference "
                  f"{error:.1e} (blocks: {blocked_error:.1e})")


if __name__ == "__main__":
    main()
