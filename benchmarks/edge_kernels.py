"""UMA's edge operators on CUDA: the Triton kernels against the same work in torch, per tile.

Random operands of one layer of the UMA-S-shaped benchmark (1008 Cu atoms, about 78
neighbours each: 78,000 edges, 128 channels, lmax = mmax = 2). Prints the median time
of each operator and its backward pass in torch (eager, on CUDA) and, for each tile
size and warp count of :mod:`fastcalc.uma.edge_kernels`, in the kernels, with their
largest difference from torch relative to its largest value.

    python benchmarks/edge_kernels.py --edges 78000 --tiles 1024 2048 4096 --warps 1 2 4

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fastcalc.uma import edge_kernels  # noqa: E402
from fastcalc.bench.timing import synchronize  # noqa: E402
from fastcalc.uma.edge_ops import dense_rotations, order_sizes, radial_rows  # noqa: E402


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
    wigner = torch.randn(e, sum((2 * l + 1) ** 2 for l in range(lmax + 1)), **cuda)
    radial = torch.randn(e, (int(rows.max()) + 1) * 2 * c, **cuda)
    neighbour = torch.randint(0, n, (e,), **cuda)
    centre = torch.randint(0, n, (e,), **cuda).sort().values
    messages = torch.randn(e, m, c, **cuda)
    envelope = torch.rand(e, **cuda)
    grad_pairs = torch.randn(e, m, 2 * c, **cuda)
    grad_nodes = torch.randn(n, k, c, **cuda)

    def torch_pairs(x=x, wigner=wigner, radial=radial):
        rotation = dense_rotations(wigner, lmax, mmax)
        pairs = torch.cat((rotation @ x[neighbour], rotation @ x[centre]), dim=2)
        return pairs * radial.view(e, -1, 2 * c)[:, rows]

    def torch_nodes(x=x, messages=messages, wigner=wigner, envelope=envelope):
        rotation = dense_rotations(wigner, lmax, mmax)
        return x.index_add(0, centre, rotation.mT @ messages * envelope.view(-1, 1, 1))

    def torch_backward(fn, inputs, grad):
        leaves = [t.clone().requires_grad_() for t in inputs]
        return torch.autograd.grad(fn(*leaves), leaves, grad)

    pairs_inputs = (x, wigner, radial)
    nodes_inputs = (x, messages, wigner, envelope)
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
    sizes = order_sizes(lmax, mmax)  # the kernels take edge-frame features by order
    message_blocks = [b.contiguous() for b in messages.split(sizes, dim=1)]
    grad_blocks = [b.contiguous() for b in grad_pairs.split(sizes, dim=1)]
    kernels = {
        "pairs": lambda: edge_kernels.pairs(x, wigner, radial, neighbour, centre, mmax, False),
        "pairs backward": lambda: edge_kernels.pairs_backward(
            grad_blocks, x, wigner, radial, neighbour, centre, mmax, False
        ),
        "nodes": lambda: edge_kernels.to_nodes(x, message_blocks, wigner, envelope, centre, mmax),
        "nodes backward": lambda: edge_kernels.to_nodes_backward(
            grad_nodes, message_blocks, wigner, envelope, centre, mmax
        ),
    }
    for tile in args.tiles:
        for warps in args.warps:
            edge_kernels.TILE, edge_kernels.WARPS = tile, warps
            *grad_messages, grad_wigner, grad_envelope = kernels["nodes backward"]()
            got = [torch.cat(kernels["pairs"](), dim=1), *kernels["pairs backward"](),
                   kernels["nodes"](), torch.cat(grad_messages, dim=1), grad_wigner,
                   grad_envelope]
            error = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, expected))
            times = ", ".join(f"{name} {median_ms(fn, args.calls):.3f}"
                              for name, fn in kernels.items())
            print(f"tile {tile}, {warps} warps: {times} ms; largest relative difference "
                  f"{error:.1e}")


if __name__ == "__main__":
    main()
