"""The network's matrix products of UMA-S at 1008 atoms in three precisions, on a GPU.

Times ``x @ w.T`` for the edge products of one UMA-S layer at 78,848 edges (forward
shapes, and the backward pass's ``grad @ w``), as IEEE float32 (cuBLAS), as one TF32
product (cuBLAS) and as three TF32 products (:mod:`fastcalc.tf32x3_kernel`), each
beside its largest error relative to the largest entry of the float64 product.

``--layouts`` times instead IEEE float32 products (TF32 with ``--tf32``) of each linear
map in both weight layouts: the forward ``x @ w.T`` with ``w`` stored (out, in), or
``x @ wt`` with a (in, out) copy, and the backward ``grad @ w`` or ``grad @ wt.T``
(cuBLAS picks its kernel by layout and shape; fastcalc stores both and reads, in float32,
``wt`` forward and ``w`` backward, in TF32 ``w.T`` forward and ``wt.T`` backward).

    python benchmarks/matmul_precision.py --rows 78848
    python benchmarks/matmul_precision.py --layouts --rows 8448 78848
    python benchmarks/matmul_precision.py --layouts --tf32 --rows 78848
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import fastcalc.precision as precision  # noqa: E402

#: (inputs, outputs) of UMA-S's linear maps per edge (128 channels, lmax = mmax = 2; edge-frame
#: features by order m, :func:`fastcalc.uma.edge_ops.order_sizes`): the first convolution's
#: m = 0, 1, 2 maps, the second's, and a layer's radial network's last map.
LINEAR_MAPS = [(768, 640), (1024, 512), (512, 256), (384, 384), (512, 512), (256, 256),
               (128, 1536)]
#: The products of one layer: each map forward, then its backward pass (outputs -> inputs),
#: each shape once (a square map's backward pass has its forward shape).
SHAPES = list(dict.fromkeys([*LINEAR_MAPS, *((n, k) for k, n in LINEAR_MAPS)]))


def median_ms(fn, calls: int = 20) -> float:
    fn()
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def layouts(rows: int, name: str) -> None:
    """Milliseconds of each of :data:`LINEAR_MAPS` at ``rows`` rows in torch's current
    precision (``name``), forward and backward, with the weight stored (out, in) or
    (in, out)."""
    print(f"\n{rows} rows, {name}, ms")
    print("| K -> N | x @ w.T | x @ wt | grad @ w | grad @ wt.T |")
    print("|---|---:|---:|---:|---:|")
    for k, n in LINEAR_MAPS:
        x, grad = torch.randn(rows, k, device="cuda"), torch.randn(rows, n, device="cuda")
        w = torch.randn(n, k, device="cuda")
        wt = w.t().contiguous()
        products = (lambda: x @ w.t(), lambda: x @ wt, lambda: grad @ w, lambda: grad @ wt.t())
        print(f"| {k} -> {n} | " + " | ".join(f"{median_ms(p):.3f}" for p in products) + " |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[78848])
    parser.add_argument("--layouts", action="store_true",
                        help="float32 products in both weight layouts instead")
    parser.add_argument("--tf32", action="store_true", help="with --layouts: TF32 products")
    args = parser.parse_args()
    if args.tf32 and not args.layouts:
        parser.error("--tf32 goes with --layouts (the precision table times TF32 anyway)")
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")
    for rows in args.rows:
        if args.layouts:
            layouts(rows, "TF32" if args.tf32 else "IEEE float32")
        else:
            precisions(rows)


def precisions(rows: int) -> None:
    """Each of :data:`SHAPES` at ``rows`` rows in the three precisions, with its error."""
    ways = {
        "float32": lambda a, b: a @ b,
        "tf32": precision._tf32_matmul,
        "3xtf32": lambda a, b: precision._tf32x3_linear(a, b, None),
    }
    print(f"| K -> N | {' | '.join(f'{w} ms' for w in ways)} | "
          f"{' | '.join(f'{w} err' for w in ways)} |")
    print("|---" * (1 + 2 * len(ways)) + "|")
    total = dict.fromkeys(ways, 0.0)
    for k, n in SHAPES:
        a = torch.randn(rows, k, device="cuda")
        b = torch.randn(n, k, device="cuda").t()
        exact = a.double() @ b.double()
        times, errors = [], []
        for name, product in ways.items():
            ms = median_ms(lambda: product(a, b))
            total[name] += ms
            times.append(f"{ms:.3f}")
            error = (product(a, b).double() - exact).abs().max() / exact.abs().max()
            errors.append(f"{float(error):.1e}")
        print(f"| {k} -> {n} | {' | '.join(times)} | {' | '.join(errors)} |")
    print("| all | " + " | ".join(f"{t:.3f}" for t in total.values()) + " |" + " |" * len(ways))


if __name__ == "__main__":
    main()
