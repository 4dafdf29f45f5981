"""The network's matrix products of UMA-S at 1008 atoms in three precisions, on a GPU.

Times ``x @ w.T`` for the edge products of one UMA-S layer at 78,848 edges (forward
shapes, and the backward pass's ``grad @ w``), as IEEE float32 (cuBLAS), as one TF32
product (cuBLAS) and as three TF32 products (:mod:`fastcalc.tf32x3_kernel`), each
beside its largest error relative to the largest entry of the float64 product.

    python benchmarks/matmul_precision.py --rows 78848
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

#: (inputs, outputs) of the edge products of one UMA-S layer (128 channels, lmax = mmax = 2):
#: the first convolution's m = 0, 1, 2 maps, the second's, and their backward passes.
SHAPES = [(384, 640), (512, 512), (256, 256), (384, 384), (640, 384), (1536, 128)]


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=78848)
    args = parser.parse_args()
    torch.set_float32_matmul_precision("highest")
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
        a = torch.randn(args.rows, k, device="cuda")
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
