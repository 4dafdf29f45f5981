"""UMA's edge operators on CUDA: the Triton kernels against the same work in torch, per tile.

Random operands of one layer of the UMA-S-shaped benchmark (1008 Cu atoms, about 78
neighbours each: 78,000 edges, 128 channels, lmax = mmax = 2). Prints the median time
of each operator and its backward pass in torch (eager, on CUDA) and, for each tile
size and warp count of :mod:`fastcalc.uma.edge_kernels`, in the kernels, with their
largest difference from torch relative to its largest value.

It also times two candidates, ``pairs backward (runs)`` and ``nodes (runs)``: each program
walks ``RUN`` blocks of edges in turn and sums what consecutive edges of one atom add to it
before one atomic add (a centre's edges are consecutive), where fastcalc's kernels add
each edge's (9, 128) share atomically: in the gathering operator's backward pass, into
both atoms (181 million adds per layer at 1008 atoms, which bound that kernel on the H200:
1.8 ms per layer, 2026-12-03), and into the centre in the scattering operator.

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
from fastcalc.uma.edge_kernels import _pairs_backward_block  # noqa: E402
from fastcalc.uma.edge_ops import radial_rows  # noqa: E402

#: Blocks of edges each program of the candidate walks in turn.
RUN = 16


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
def _pairs_backward_runs_kernel(
    grad_ptr, x_ptr, rot_ptr, radial_ptr, src_ptr,
    grad_x_ptr, grad_rot_ptr, grad_radial_ptr,
    E, C,
    LMAX: tl.constexpr, MMAX: tl.constexpr, M: tl.constexpr, K: tl.constexpr, NR: tl.constexpr,
    KP: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, RUN: tl.constexpr,
):
    side = tl.program_id(1)
    k = tl.arange(0, KP)
    c = tl.arange(0, BLOCK_C)
    atom_offsets = k[:, None] * C + c[None, :]
    atom_mask = (k < K)[:, None] & (c < C)[None, :]
    total = tl.zeros((KP, BLOCK_C), dtype=grad_x_ptr.dtype.element_ty)
    current = tl.full((), -1, tl.int64)  # the atom whose gradient ``total`` holds
    for step in range(RUN):
        e = (tl.program_id(0) * RUN + step) * BLOCK_E + tl.arange(0, BLOCK_E)
        grad_x, x_offsets, x_mask = _pairs_backward_block(
            grad_ptr, x_ptr, rot_ptr, radial_ptr, src_ptr, grad_rot_ptr, grad_radial_ptr,
            side, e, E, C, LMAX, MMAX, M, K, NR, KP, BLOCK_C)
        atoms = tl.load(src_ptr + side * E + e, mask=e < E, other=-1).to(tl.int64)
        first = tl.min(tl.where(e < E, atoms, E), axis=0)
        last = tl.max(atoms, axis=0)
        if (first == last) & (first == current):
            total += tl.sum(grad_x, axis=0)
        else:
            if current >= 0:
                tl.atomic_add(grad_x_ptr + current * (K * C) + atom_offsets, total,
                              mask=atom_mask)
            if first == last:
                total = tl.sum(grad_x, axis=0)
                current = first
            else:
                tl.atomic_add(grad_x_ptr + x_offsets, grad_x, mask=x_mask)
                total = tl.zeros((KP, BLOCK_C), dtype=grad_x_ptr.dtype.element_ty)
                current = tl.full((), -1, tl.int64)
    if current >= 0:
        tl.atomic_add(grad_x_ptr + current * (K * C) + atom_offsets, total, mask=atom_mask)


def pairs_backward_runs(grad, x, rotation, radial, neighbour, centre, mmax):
    """The candidate: ``edge_kernels.pairs_backward`` where each program walks ``RUN``
    blocks of edges and sums the features' gradient of consecutive edges of one atom
    (a centre's edges are consecutive) before one atomic add, not one per edge."""
    edges = rotation.shape[0]
    grad_x = torch.zeros_like(x)
    grad_rotation = rotation.new_empty(2, *rotation.shape)
    grad_radial = torch.empty_like(radial)
    layout = edge_kernels._layout(x, rotation, radial, mmax)
    _pairs_backward_runs_kernel[(triton.cdiv(edges, layout["BLOCK_E"] * RUN), 2)](
        grad, x, rotation, radial, torch.stack((neighbour, centre)),
        grad_x, grad_rotation, grad_radial, edges, x.shape[2], RUN=RUN, **layout
    )
    return grad_x, grad_rotation.sum(dim=0), grad_radial


@triton.jit
def _to_nodes_runs_kernel(
    msg_ptr, rot_ptr, env_ptr, centre_ptr, out_ptr,
    E, C,
    M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, RUN: tl.constexpr,
):
    i = tl.arange(0, MP)
    c = tl.arange(0, BLOCK_C)
    k = tl.arange(0, KP)
    i_ok = i < M
    c_ok = c < C
    atom_offsets = k[:, None] * C + c[None, :]
    atom_mask = (k < K)[:, None] & c_ok[None, :]
    total = tl.zeros((KP, BLOCK_C), dtype=out_ptr.dtype.element_ty)
    current = tl.full((), -1, tl.int64)  # the centre whose sum ``total`` holds
    for step in range(RUN):
        e = (tl.program_id(0) * RUN + step) * BLOCK_E + tl.arange(0, BLOCK_E)
        e_ok = e < E
        e = e.to(tl.int64)
        messages = tl.load(
            msg_ptr + e[:, None, None] * (M * C) + i[None, :, None] * C + c[None, None, :],
            mask=e_ok[:, None, None] & i_ok[None, :, None] & c_ok[None, None, :], other=0.0,
        )
        envelope = tl.load(env_ptr + e, mask=e_ok, other=0.0)
        centre = tl.load(centre_ptr + e, mask=e_ok, other=-1).to(tl.int64)
        first = tl.min(tl.where(e_ok, centre, E), axis=0)
        last = tl.max(centre, axis=0)
        ec_mask = e_ok[:, None] & c_ok[None, :]
        block = tl.zeros((KP, BLOCK_C), dtype=out_ptr.dtype.element_ty)
        for kk in tl.static_range(K):
            r = tl.load(rot_ptr + e[:, None] * (M * K) + i[None, :] * K + kk,
                        mask=e_ok[:, None] & i_ok[None, :], other=0.0)
            back = tl.sum(r[:, :, None] * messages, axis=1) * envelope[:, None]
            if first == last:
                block += tl.where(k[:, None] == kk, tl.sum(back, axis=0)[None, :], 0.0)
            else:
                tl.atomic_add(out_ptr + centre[:, None] * (K * C) + kk * C + c[None, :], back,
                              mask=ec_mask)
        if (first == last) & (first == current):
            total += block
        else:
            if current >= 0:
                tl.atomic_add(out_ptr + current * (K * C) + atom_offsets, total, mask=atom_mask)
            total = block
            current = tl.where(first == last, first, -1)
    if current >= 0:
        tl.atomic_add(out_ptr + current * (K * C) + atom_offsets, total, mask=atom_mask)


def to_nodes_runs(x, messages, rotation, envelope, centre):
    """The candidate: ``edge_kernels.to_nodes`` with each program's consecutive edges of one
    centre summed before one atomic add, as in :func:`pairs_backward_runs`."""
    edges, m, k = rotation.shape
    out = x.clone(memory_format=torch.contiguous_format)
    padded, block_c, block_e = edge_kernels._block_sizes(m, messages.shape[2])
    _to_nodes_runs_kernel[(triton.cdiv(edges, block_e * RUN),)](
        messages, rotation, envelope, centre, out, edges, messages.shape[2],
        M=m, MP=padded, K=k, KP=triton.next_power_of_2(k), BLOCK_E=block_e, BLOCK_C=block_c,
        RUN=RUN, num_warps=edge_kernels.WARPS,
    )
    return out


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
        "pairs backward (runs)": lambda: pairs_backward_runs(
            grad_pairs, x, rotation, radial, neighbour, centre, mmax
        ),
        "nodes": lambda: edge_kernels.to_nodes(x, messages, rotation, envelope, centre),
        "nodes (runs)": lambda: to_nodes_runs(x, messages, rotation, envelope, centre),
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
            runs = kernels["pairs backward (runs)"]()
            runs = [*runs, kernels["nodes (runs)"]()]
            runs_error = max(float((a - b).abs().max() / b.abs().max())
                             for a, b in zip(runs, expected[1:5]))
            times = ", ".join(f"{name} {median_ms(fn, args.calls):.3f}"
                              for name, fn in kernels.items())
            print(f"tile {tile}, {warps} warps: {times} ms; largest relative difference "
                  f"{error:.1e} (runs: {runs_error:.1e})")


if __name__ == "__main__":
    main()
