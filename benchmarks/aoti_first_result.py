"""A candidate for the warm first result: the traced graph as an AOTInductor package.

fastcalc's disk cache stores torch's ``aot_compile`` of a model's traced graph; a process
loading it imports dynamo and inductor and loads every Triton kernel through Triton's
JIT, a few seconds on the H200 (README, "The first call"). An AOTInductor package is a
shared library with the kernels inside, which ``torch._C._aoti.AOTIModelPackageLoader``
loads without importing dynamo or inductor. This measures that path for one model.

``build`` evaluates one copper structure with the calculator in eager mode to get the
traced function's padded inputs, traces it (:func:`fastcalc.tracing.trace`), exports the
graph with every size dynamic, compiles the package (the model's tensors inside it) and
saves the inputs and the eager outputs. ``load`` is then run in fresh processes: it
imports torch and what registers fastcalc's operators, loads the package, calls it once
on the saved inputs and prints the seconds of each step and the largest difference from
the eager outputs; on CUDA it also records a call in a CUDA graph, replays it and prints
the difference from the plain call.

    python benchmarks/aoti_first_result.py pet --device cuda --atoms 64 --folder /tmp/aoti
    python benchmarks/aoti_first_result.py uma --device cuda --atoms 108 --folder /tmp/aoti --small

On the H200's torch 2.11 (CUDA 13 build) the loading process crashes with a segmentation
fault, as torch's own ``torch._inductor.aoti_load_package`` does there on the package of a
single ``nn.Linear`` (CUDA or CPU, 2026-12-04); on torch 2.13 (CPU) it runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(model: str, device: str, atoms: int, folder: Path, small: bool) -> None:
    """Trace ``model``'s function on one structure, compile its package into ``folder``."""
    sys.path.insert(0, str(ROOT))
    import torch
    import torch._inductor
    from torch.export import Dim

    from fastcalc.bench import copper
    from fastcalc.bench.suite import MODELS
    from fastcalc.tracing import trace

    contest = MODELS[model](folder, device, small)
    calculator = contest.eager()
    runner = calculator._runner
    seen: list[tuple] = []
    original = runner.fn
    runner.fn = lambda *inputs: seen.append(inputs) or original(*inputs)
    structure = copper(atoms)
    structure.calc = calculator
    structure.get_potential_energy()
    runner.fn = original
    inputs = tuple(x.detach() for x in seen[0])
    with torch.enable_grad():
        expected = original(*inputs)
        start = time.perf_counter()
        graph = trace(original, inputs)
        traced = time.perf_counter()
        dynamic = [tuple(Dim.AUTO for _ in x.shape) for x in inputs]
        program = torch.export.export(graph, inputs, dynamic_shapes=dynamic, strict=False)
        exported = time.perf_counter()
        torch._inductor.aoti_compile_and_package(program, package_path=str(folder / "model.pt2"))
    done = time.perf_counter()
    torch.save({"inputs": inputs, "expected": [x.detach() for x in expected]},
               folder / "inputs.pt")
    print(json.dumps({"trace_s": traced - start, "export_s": exported - traced,
                      "compile_s": done - exported,
                      "package_mb": (folder / "model.pt2").stat().st_size / 1e6}))


def load(model: str, folder: Path) -> None:
    """Import, load the package, call it once; print the seconds and the difference."""
    start = time.perf_counter()
    import torch

    imported = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    if model == "uma":  # registers fastcalc's edge operators, which the package calls
        import fastcalc.uma.edge_ops  # noqa: F401
    operators = time.perf_counter()
    # the inputs first: on CUDA they initialise torch's CUDA context before the loader
    # runs (a loader made first crashed on the H200 on 2026-12-03, maybe for want of it)
    saved = torch.load(folder / "inputs.pt")
    inputs_loaded = time.perf_counter()
    loader = torch._C._aoti.AOTIModelPackageLoader(str(folder / "model.pt2"), "model", False,
                                                   1, -1)
    loaded = time.perf_counter()
    outputs = loader.run(list(saved["inputs"]))
    if outputs[0].is_cuda:
        torch.cuda.synchronize()
    called = time.perf_counter()
    difference = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                     for a, b in zip(outputs, saved["expected"]) if b.is_floating_point())
    replayed = _replay_difference(loader, saved["inputs"], outputs) if outputs[0].is_cuda else None
    print(json.dumps({
        "torch_import_s": imported - start, "operators_import_s": operators - imported,
        "inputs_s": inputs_loaded - operators, "load_s": loaded - inputs_loaded,
        "first_call_s": called - loaded,
        "largest_relative_difference": difference,
        "cuda_graph_replay_difference": replayed,
        "dynamo_imported": "torch._dynamo" in sys.modules,
        "inductor_imported": "torch._inductor" in sys.modules,
    }))


def _replay_difference(loader, inputs: tuple, outputs: list) -> float:
    """Record one call of the package in a CUDA graph (as fastcalc replays its compiled
    graphs), replay it and return the largest difference from the plain call."""
    import torch

    static = [x.clone() for x in inputs]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recorded = loader.run(static)
    graph.replay()
    torch.cuda.synchronize()
    return max(float((a - b).abs().max()) for a, b in zip(recorded, outputs)
               if b.is_floating_point())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["pet", "uma"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--atoms", type=int, default=64)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--small", action="store_true", help="the tiny model of the tests")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        return load(args.model, args.folder)
    args.folder.mkdir(parents=True, exist_ok=True)
    build(args.model, args.device, args.atoms, args.folder, args.small)
    for _ in range(args.processes):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-X", "faulthandler", __file__, args.model, "--folder",
                               str(args.folder), "--load"], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the loading process ended with {done.returncode}:\n"
                               f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        print(done.stdout.strip().splitlines()[-1], f"process {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
