"""Bytes the kernels of UMA's compiled energy-forces-stress graph read and write, per
padded edge, as inductor's scheduler counts them, compiled for the CPU.

Builds a random-weight UMA-S-shaped checkpoint (or reads ``--checkpoint``) and the padded
inputs of rattled fcc copper (as ``benchmarks/graph_memory.py`` does), traces
``UMACore.energy_and_gradients`` with :func:`fastcalc.tracing.trace` and compiles the
graph with ``torch.compile`` as the calculators do, every cache off, so that inductor
schedules it anew. For each kernel its scheduler gives the bytes of the buffers it reads
and writes (``GraphLowering.count_bytes``); the report sums them per padded edge for the
compiler-generated kernels and for the others (matrix products and fastcalc's custom
operators, whose inputs and outputs are those of their CUDA kernels), and lists the
largest compiler-generated kernels with the source lines they came from.

A proxy for the GPU's memory traffic, measured without one: inductor fuses for the GPU
with the same scheduler but other heuristics, so the CUDA kernels differ in detail, and
bytes are not time. Compare two versions of the code with it, then time them on a GPU.

    python benchmarks/kernel_bytes.py --atoms 108
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
from pathlib import Path

import torch
import torch._inductor.config
import torch._inductor.metrics

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from graph_memory import source_line, traced_core  # noqa: E402

from fastcalc.bench.timing import COPPER_REPEATS  # noqa: E402
from fastcalc.saved_graph import COMPILE_OPTIONS  # noqa: E402

#: The logger whose INFO level makes inductor count each kernel's bytes.
METRICS_LOGGER = "torch._inductor.compile_fx.__inductor_metrics"
COMPILER_KERNELS = ("SchedulerNode", "FusedSchedulerNode")


def kernel_bytes(fn, inputs: tuple) -> list[tuple[object, int]]:
    """Each scheduled kernel of ``fn`` compiled as fastcalc compiles, with its bytes."""
    logger = logging.getLogger(METRICS_LOGGER)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    torch._inductor.metrics.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        torch.compile(fn, dynamic=True, options=COMPILE_OPTIONS)(*inputs)
    # count_bytes stores each kernel's bytes divided by 4
    return [(node, 4 * count) for node, count in torch._inductor.metrics.nodes_num_elem]


def sources(node: object) -> collections.Counter:
    """The source lines of the graph nodes a scheduled kernel computes."""
    origins = set()
    for part in node.get_nodes():
        origins |= getattr(part.node, "origins", set()) if part.node is not None else set()
    return collections.Counter(source_line(origin, 1) for origin in origins)


def extern_name(node: object) -> str:
    """The kernel an extern node calls (a matrix product, a custom operator)."""
    return str(getattr(node.node, "python_kernel_name", None) or type(node.node).__name__)


def report(kernels: list[tuple[object, int]], edges: int, top: int) -> str:
    """Bytes per edge by kind, then the ``top`` compiler-generated kernels."""
    compiler = [(n, b) for n, b in kernels if type(n).__name__ in COMPILER_KERNELS]
    others = collections.Counter()
    for node, nbytes in kernels:
        if type(node).__name__ == "ExternKernelSchedulerNode":
            others[extern_name(node)] += nbytes
    lines = [
        f"compiler-generated kernels: {len(compiler)}, "
        f"{sum(b for _, b in compiler) / edges:,.0f} bytes per edge",
        f"other kernels: {sum(others.values()) / edges:,.0f} bytes per edge",
    ]
    lines += [f"  {b / edges:10,.0f}  {name}" for name, b in others.most_common()]
    lines.append("largest compiler-generated kernels (bytes per edge, source lines):")
    for node, nbytes in sorted(compiler, key=lambda item: -item[1])[:top]:
        where = ", ".join(f"{line} x{count}" for line, count in sources(node).most_common(3))
        lines.append(f"  {nbytes / edges:10,.0f}  {node.get_name()[:32]:32s} {where}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atoms", type=int, default=108, choices=sorted(COPPER_REPEATS))
    parser.add_argument(
        "--checkpoint", type=Path, help="UMA checkpoint; a UMA-S-shaped one is written here if missing"
    )
    parser.add_argument("--top", type=int, default=20, help="compiler-generated kernels listed")
    args = parser.parse_args()
    _, inputs, graph = traced_core(args.checkpoint, args.atoms, torch.float32)
    edges = inputs[3].shape[1]
    print(f"UMA core, {args.atoms} Cu atoms padded to {len(inputs[0])}, {edges} padded edges, "
          f"float32, compiled for the CPU (torch {torch.__version__})")
    print(report(kernel_bytes(graph, inputs), edges, args.top))


if __name__ == "__main__":
    main()
