"""UMA's edge operators on CUDA: the Triton kernels against the same work in torch, per tile.

Random operands of one layer of the UMA-S-shaped benchmark (1008 Cu atoms, about 78
neighbours each: 78,000 edges, 128 channels, lmax = mmax = 2). Prints the median time
of each operator and its backward pass in torch (eager, on CUDA) and, for each tile
size and warp count of :mod:`fastcalc.uma.edge_kernels`, in the kernels, with their
largest difference from torch relative to its largest value.

It also times a candidate not yet used by fastcalc, ``pairs backward (segments)``: the
backward pass of the gathering operator without atomic adds. One program per atom and
side walks that atom's edges (sorted by atom outside the kernel), loads the atom's
features once and writes its feature gradient once, where fastcalc's kernel adds each
edge's (9, 128) gradient into both atoms atomically (181 million adds per layer at
1008 atoms; 1.7 ms of its layer's 2.1 ms of edge kernels on the H200, 2026-12-03).

    python benchmarks/edge_kernels.py --edges 78000 --tiles 2048 4096 8192 --warps 1 2 4

On a machine without a GPU, Triton's interpreter checks the kernels' numbers (slowly):

    TRITON_INTERPRET=1 python benchmarks/edge_kernels.py --device cpu --atoms 12 --edges 200 --tiles 4096 --warps 2 --calls 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fastcalc.uma import edge_kernels  # noqa: E402
from fastcalc.bench.timing import synchronize  # noqa: E402
from fastcalc.uma.edge_kernels import _component_backward, _order_start  # noqa: E402
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


@triton.jit
def _pairs_backward_segments_kernel(
    grad_ptr, x_ptr, rot_ptr, radial_ptr, order_ptr, offsets_ptr,
    grad_x_ptr, grad_rot_ptr, grad_radial_ptr,
    N, E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, M: tl.constexpr, K: tl.constexpr, NR: tl.constexpr,
    KP: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    atom = tl.program_id(0)
    side = tl.program_id(1)
    k = tl.arange(0, KP)
    c = tl.arange(0, BLOCK_C)
    x_offsets = atom.to(tl.int64) * (K * C) + k[:, None] * C + c[None, :]
    x_mask = (k < K)[:, None] & (c < C)[None, :]
    # the atom's features, the same for every edge of a block
    x = tl.load(x_ptr + x_offsets, mask=x_mask, other=0.0)[None, :, :]
    start = tl.load(offsets_ptr + side * (N + 1) + atom)
    end = tl.load(offsets_ptr + side * (N + 1) + atom + 1)
    grad_x = tl.zeros((KP, BLOCK_C), dtype=x.dtype)
    for first in range(start, end, BLOCK_E):
        slot = first + tl.arange(0, BLOCK_E)
        e_ok = slot < end
        e = tl.load(order_ptr + side * E + slot, mask=e_ok, other=0).to(tl.int64)
        mask = e_ok[:, None] & (c < C)[None, :]
        radial = e[:, None] * (NR * 2 * C) + side * C + c[None, :]
        grad = grad_ptr + e[:, None] * (M * 2 * C) + side * C + c[None, :]
        grad_rot = grad_rot_ptr + side * E * M * K + e[:, None] * (M * K) + k[None, :]
        for l in tl.static_range(LMAX + 1):
            scale = tl.load(radial_ptr + radial + l * 2 * C, mask=mask, other=0.0)
            grad_scale, update = _component_backward(
                grad, rot_ptr, grad_rot, x, scale, e, e_ok, k, mask, l, M, K, C)
            grad_x += tl.sum(update, axis=0)
            tl.store(grad_radial_ptr + radial + l * 2 * C, grad_scale, mask=mask)
        for m in tl.static_range(1, MMAX + 1):
            for j in tl.static_range(LMAX - m + 1):
                row = LMAX + 1 + _order_start(m, LMAX) + j
                plus = LMAX + 1 + 2 * _order_start(m, LMAX) + j
                scale = tl.load(radial_ptr + radial + row * 2 * C, mask=mask, other=0.0)
                grad_plus, update = _component_backward(
                    grad, rot_ptr, grad_rot, x, scale, e, e_ok, k, mask, plus, M, K, C)
                grad_x += tl.sum(update, axis=0)
                grad_minus, update = _component_backward(
                    grad, rot_ptr, grad_rot, x, scale, e, e_ok, k, mask, plus + LMAX - m + 1,
                    M, K, C)
                grad_x += tl.sum(update, axis=0)
                tl.store(grad_radial_ptr + radial + row * 2 * C, grad_plus + grad_minus,
                         mask=mask)
    tl.store(grad_x_ptr + side * N * K * C + x_offsets, grad_x, mask=x_mask)


def pairs_backward_segments(grad, x, rotation, radial, neighbour, centre, mmax):
    """The candidate: ``edge_kernels.pairs_backward`` without atomic adds (module docstring)."""
    atoms, edges = x.shape[0], rotation.shape[0]
    sources, order = torch.stack((neighbour, centre)).sort(dim=1, stable=True)
    bounds = torch.arange(atoms + 1, device=x.device).expand(2, -1).contiguous()
    offsets = torch.searchsorted(sources, bounds)
    grad_x = x.new_empty(2, *x.shape)
    grad_rotation = rotation.new_empty(2, *rotation.shape)
    grad_radial = torch.empty_like(radial)
    layout = edge_kernels._layout(x, rotation, radial, mmax)
    _pairs_backward_segments_kernel[(atoms, 2)](
        grad, x, rotation, radial, order, offsets, grad_x, grad_rotation, grad_radial,
        atoms, edges, x.shape[2], **layout
    )
    return grad_x.sum(dim=0), grad_rotation.sum(dim=0), grad_radial


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
        "pairs backward (segments)": lambda: pairs_backward_segments(
            grad_pairs, x, rotation, radial, neighbour, centre, mmax
        ),
        "nodes": lambda: edge_kernels.to_nodes(x, messages, rotation, envelope, centre),
        "nodes backward": lambda: edge_kernels.to_nodes_backward(
            grad_nodes, messages, rotation, envelope, centre
        ),
    }
    for tile in args.tiles:
        for warps in args.warps:
            edge_kernels.TILE, edge_kernels.WARPS = tile, warps
            got = [kernels["pairs"](), *kernels["pairs backward"](), kernels["nodes"](),
                   *kernels["nodes backward"]()]
            error = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, expected))
            segments = kernels["pairs backward (segments)"]()
            segments_error = max(float((a - b).abs().max() / b.abs().max())
                                 for a, b in zip(segments, expected[1:4]))
            times = ", ".join(f"{name} {median_ms(fn, args.calls):.3f}"
                              for name, fn in kernels.items())
            print(f"tile {tile}, {warps} warps: {times} ms; largest relative difference "
                  f"{error:.1e} (segments: {segments_error:.1e})")


if __name__ == "__main__":
    main()
