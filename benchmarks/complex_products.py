"""UMA's complex-pair SO(2) products as one real block product or as three products.

For order m > 0, an SO(2) convolution maps the +m and -m rows ``(x_r, x_i)`` of an edge
as a complex product with weights ``W1 + i W2``: fastcalc (like fairchem) multiplies
``[x_r | x_i]`` (E, 2K) by the real block matrix ``[[W1, -W2], [W2, W1]]`` (four real
products' worth of arithmetic). Gauss's three-product form computes ``t1 = x_r W1^T``,
``t2 = x_i W2^T``, ``t3 = (x_r + x_i)(W1 + W2)^T``, then ``y_r = t1 - t2`` and
``y_i = t3 - t1 - t2``: a quarter less arithmetic, plus one sum of inputs and a
combination of outputs.

Times, on a GPU inside CUDA graphs (medians of 50 replays, ms), each of UMA-S's complex
pairs (K -> N per side: the first convolution's m = 1 and m = 2, the second's, then the
backward pass's transposed shapes) at 8,448 and 78,848 edges (108 and 1008 copper
atoms), as: the block product; the three products with their inputs ready; the three as
one batched product of stacked inputs; the three with the sum and combination as
separate torch operations. Each beside its largest error relative to the largest entry of
the float64 product.

    python benchmarks/complex_products.py
"""

from __future__ import annotations

import statistics
import sys

import torch

#: (K, N) per side of each complex pair of UMA-S (128 channels, lmax = mmax = 2): the
#: first convolution's m = 1 and m = 2, the second's m = 1 and m = 2.
PAIRS = [(512, 256), (256, 128), (256, 256), (128, 128)]
#: Forward shapes, then the backward pass's transposed ones (square ones only once).
SHAPES = PAIRS + [(n, k) for k, n in PAIRS if k != n]


def graph_ms(fn, replays: int = 50) -> float:
    """Median milliseconds of ``fn`` recorded as one CUDA graph and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def row(rows: int, k: int, n: int) -> list[float]:
    """Milliseconds of the four forms and the errors of the block and three-product forms."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, 2 * k, device="cuda", generator=generator)
    w1 = torch.randn(n, k, device="cuda", generator=generator) / k**0.5
    w2 = torch.randn(n, k, device="cuda", generator=generator) / k**0.5
    block = torch.cat((torch.cat((w1, -w2), 1), torch.cat((w2, w1), 1)))  # (2N, 2K)
    w3 = w1 + w2
    xr, xi = x[:, :k].contiguous(), x[:, k:].contiguous()
    total = xr + xi
    stacked_x = torch.stack((xr, xi, total))
    stacked_w = torch.stack((w1.T, w2.T, w3.T)).contiguous()
    out: dict[str, object] = {}

    def block_product() -> None:
        out["block"] = x @ block.T

    def three_products() -> None:
        out["three"] = (xr @ w1.T, xi @ w2.T, total @ w3.T)

    def batched() -> None:
        out["batched"] = torch.bmm(stacked_x, stacked_w)

    def with_sums() -> None:
        t1, t2, t3 = xr @ w1.T, xi @ w2.T, (xr + xi) @ w3.T
        out["gauss"] = torch.cat((t1 - t2, t3 - t1 - t2), 1)

    times = [graph_ms(f) for f in (block_product, three_products, batched, with_sums)]
    block_product()
    with_sums()
    exact = x.double() @ block.double().T
    scale = exact.abs().max()
    errors = [float((out[name].double() - exact).abs().max() / scale) for name in ("block", "gauss")]
    return times + errors


def main() -> None:
    print(torch.cuda.get_device_name(0), torch.__version__)
    print("| precision | rows | K -> N | block | three | batched three | three with sums "
          "| block err | three err |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for rows in (8448, 78848):
            for k, n in SHAPES:
                *ms, block_err, three_err = row(rows, k, n)
                print(f"| {'tf32' if tf32 else 'float32'} | {rows} | {k} -> {n} | "
                      + " | ".join(f"{t:.3f}" for t in ms)
                      + f" | {block_err:.1e} | {three_err:.1e} |")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
