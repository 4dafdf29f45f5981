"""Where one fastcalc call spends its time: synchronised medians per phase.

Each phase of a calculator call (neighbour list, topology, padding, compiled graph,
post-processing) is wrapped in a timer that synchronises the device before and
after it, so the phases add up to a little more than an unsynchronised call; the
unsynchronised median is printed too. Also prints how many host-device copies and
synchronisations one call makes (torch.profiler). Same models as ``fastcalc bench``.

    python benchmarks/profile_phases.py pet --device cuda --sizes 64 1008
    python benchmarks/profile_phases.py uma --device cuda --sizes 108 1008
    python benchmarks/profile_phases.py uma --kernels --precision tf32 --sizes 1008
    python benchmarks/profile_phases.py uma --kernels --sizes 1008 --snapshot uma.pickle
    python benchmarks/profile_phases.py uma fairchem --kernels --sizes 1008
    python benchmarks/profile_phases.py pet --many 256 --precision tf32

``uma fairchem`` profiles fastcalc's and fairchem's calculators on the same random
UMA-S-shaped checkpoint in one process (fairchem: its ``high-precision`` preset, or
``multigpu`` with ``--precision tf32``, as ``fastcalc bench`` runs them), so that their
kernel families can be compared side by side; fairchem takes ``--kernels`` only.

``--many N`` times ``evaluate_many`` over N rattled 64-atom copper cells (the throughput
workload's first set) instead: a pass unsynchronised, its phases synchronised (building
the batch with its neighbour search; evaluating it, layout and compiled graph included;
the compiled graph), the device's kernel time per pass, so that the time the device
waits for the host shows, and Python's profile of one pass.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from ase.calculators.calculator import Calculator, all_changes
from torch.autograd import DeviceType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fastcalc.bench import copper  # noqa: E402
from fastcalc.precision import PRECISIONS  # noqa: E402
from fastcalc.bench.suite import PET_S, uma_contest  # noqa: E402
from fastcalc.bench.throughput import throughput_sets  # noqa: E402
from fastcalc.bench.upstream import export_pet  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class PhaseTimer:
    """Wraps callables so that, while enabled, each call's synchronised time is recorded."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)
        self.enabled = False

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            if not self.enabled:
                return fn(*args, **kwargs)
            _sync()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            _sync()
            self.times[name].append(time.perf_counter() - start)
            return out

        return timed

    def patch(self, owner: object, attribute: str, name: str | None = None) -> None:
        setattr(owner, attribute, self.wrap(name or attribute, getattr(owner, attribute)))


def _call(calc: Calculator, atoms) -> float:
    atoms = atoms.copy()
    atoms.positions += torch.randn(len(atoms), 3, dtype=torch.float64).numpy() * 0.01
    _sync()
    start = time.perf_counter()
    calc.calculate(atoms, ["energy", "forces", "stress"], all_changes)
    _sync()
    return time.perf_counter() - start


def kernels(calc: Calculator, natoms: int, snapshot: Path | None = None) -> None:
    """The device kernels of one call (run without CUDA graphs so they are visible);
    with ``snapshot``, torch's memory snapshot of one more call written there (its
    allocations, with the Python frames that made them: view it at pytorch.org/memory_viz)."""
    atoms = copper(natoms)
    for _ in range(3):
        _call(calc, atoms)
    if snapshot is not None:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        _call(calc, atoms)
        torch.cuda.memory._dump_snapshot(str(snapshot))
        torch.cuda.memory._record_memory_history(enabled=None)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with torch.profiler.profile() as prof:
        for _ in range(3):
            _call(calc, atoms)
    events = prof.key_averages()
    table = events.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70)
    print(f"\n== {natoms} atoms, kernels of 3 calls\n{table}")
    if torch.cuda.is_available():
        print(f"peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    print(kernel_summary(events, calls=3))


_MATMUL_KERNELS = ("gemm", "xmma", "magma", "cutlass")


def kernel_summary(events, calls: int, top: int = 15) -> str:
    """Device time and kernel count per call, by family: matrix products (cuBLAS and
    cutlass kernels), compiler-generated (triton) and other kernels; then the ``top``
    kernels that took the most device time."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    kernels = [event for event in events if event.device_type == DeviceType.CUDA]
    for event in kernels:
        if any(part in event.key for part in _MATMUL_KERNELS):
            family = "matrix products"
        elif event.key.startswith("triton_"):
            family = "triton"
        else:
            family = "other"
        totals[family][0] += event.self_device_time_total / calls / 1e3
        totals[family][1] += event.count / calls
    lines = [f"  {name:16s} {ms:8.2f} ms/call {count:6.0f} kernels/call"
             for name, (ms, count) in sorted(totals.items())]
    all_ms, all_count = sum(v[0] for v in totals.values()), sum(v[1] for v in totals.values())
    largest = sorted(kernels, key=lambda event: -event.self_device_time_total)[:top]
    return "\n".join([
        "per call, by kernel family:", *lines,
        f"  {'all':16s} {all_ms:8.2f} ms/call {all_count:6.0f} kernels/call",
        f"largest {len(largest)} kernels (ms per call, launches per call, name):",
        *(f"  {event.self_device_time_total / calls / 1e3:8.3f} {event.count / calls:5.0f}  "
          f"{event.key[:90]}" for event in largest),
    ])


def profile(calc: Calculator, timer: PhaseTimer, natoms: int, calls: int) -> None:
    atoms = copper(natoms)
    start = time.perf_counter()
    for _ in range(3):
        _call(calc, atoms)
    print(f"\n== {natoms} atoms: warm-up {time.perf_counter() - start:.1f} s", flush=True)
    plain = [_call(calc, atoms) for _ in range(calls)]
    timer.times.clear()
    timer.enabled = True
    synced = [_call(calc, atoms) for _ in range(calls)]
    timer.enabled = False
    print(f"call, unsynchronised phases: {statistics.median(plain) * 1e3:8.2f} ms")
    print(f"call, synchronised phases:   {statistics.median(synced) * 1e3:8.2f} ms")
    for name, values in timer.times.items():
        per_call = sum(values) / calls
        print(f"  {name:24s} {per_call * 1e3:8.2f} ms/call ({len(values) / calls:.1f} calls)")
    with torch.profiler.profile() as prof:
        for _ in range(3):
            _call(calc, atoms)
    events = prof.key_averages()
    wanted = ("cudaStreamSynchronize", "cudaMemcpyAsync", "cudaLaunchKernel", "cudaGraphLaunch",
              "aten::item", "aten::_local_scalar_dense", "aten::nonzero")
    for event in events:
        if event.key in wanted:
            print(f"  {event.key:28s} {event.count / 3:7.1f} per call, "
                  f"cpu {event.cpu_time_total / 3e3:6.2f} ms")
    print(events.table(sort_by="self_cpu_time_total", row_limit=18))


def many(calc: Calculator, count: int, max_atoms: int, passes: int = 5) -> None:
    """Phases of ``calc.evaluate_many`` over ``count`` 64-atom copper cells, in batches of
    at most ``max_atoms`` atoms."""
    structures = next(iter(throughput_sets().values()))[:count]
    start = time.perf_counter()
    for _ in range(2):
        calc.evaluate_many(structures, max_atoms=max_atoms)
    print(f"\n== evaluate_many, {count} x 64 atoms: warm-up {time.perf_counter() - start:.1f} s")

    def timed_pass() -> float:
        _sync()
        start = time.perf_counter()
        calc.evaluate_many(structures, max_atoms=max_atoms)
        _sync()
        return time.perf_counter() - start

    plain = statistics.median(timed_pass() for _ in range(passes))
    timer = PhaseTimer()
    for attribute in ("_batch_system", "evaluate_batch", "_batch_runner"):
        timer.patch(calc, attribute)
    timer.enabled = True
    synced = statistics.median(timed_pass() for _ in range(passes))
    timer.enabled = False
    print(f"pass, unsynchronised: {plain * 1e3:8.2f} ms ({count / plain:.0f} structures/s)")
    print(f"pass, synchronised phases: {synced * 1e3:8.2f} ms")
    for name, values in timer.times.items():
        print(f"  {name:24s} {sum(values) / passes * 1e3:8.2f} ms/pass "
              f"({len(values) / passes:.1f} calls)")
    with torch.profiler.profile() as prof:
        calc.evaluate_many(structures, max_atoms=max_atoms)
        _sync()
    print("device kernels of one pass (a \"call\" below is the whole pass):")
    print(kernel_summary(prof.key_averages(), calls=1))
    profiler = cProfile.Profile()
    profiler.runcall(calc.evaluate_many, structures, max_atoms=max_atoms)
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats("fastcalc", 30)


def pet(
    device: str, mode: str | None, precision: str, folder: Path
) -> tuple[Calculator, PhaseTimer]:
    import fastcalc.pet.calculator as module

    path = folder / "pet-s.pt"
    export_pet(PET_S, path)
    calc = module.CompiledPETCalculator(path, device=device, compile_mode=mode,
                                        precision=precision)
    timer = PhaseTimer()
    timer.patch(calc.neighbors, "candidates", "neighbors")
    timer.patch(calc, "_prepare", "prepare (per search)")
    for name in ("graph_inputs", "apply_reference"):
        timer.patch(module, name)
    calc._runner = timer.wrap("graph", calc._runner)
    return calc, timer


def uma(
    device: str, mode: str | None, precision: str, path: Path
) -> tuple[Calculator, PhaseTimer]:
    import fastcalc.uma.calculator as module

    calc = module.BucketedCalculator(
        path, task_name="omat", device=device, compile_mode=mode or "reduce-overhead",
        precision=precision,
    )
    timer = PhaseTimer()
    timer.patch(calc.neighbors, "candidates", "neighbors")
    timer.patch(calc, "_prepared_candidates", "candidates (per search)")
    for name in ("check_charge_and_spin", "pad_atoms"):
        timer.patch(module, name)
    timer.patch(calc.core, "prepare")
    timer.patch(calc.core, "outputs")
    calc._runner = timer.wrap("graph", calc._runner)
    return calc, timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", choices=["pet", "uma"])
    parser.add_argument("upstream", nargs="?", choices=["fairchem"],
                        help="with uma --kernels: profile fairchem's calculator too")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1008])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--kernels", action="store_true", help="list device kernels instead")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32")
    parser.add_argument("--many", type=int, metavar="N",
                        help="profile evaluate_many over N 64-atom cells instead")
    parser.add_argument("--max-atoms", type=int, default=8192,
                        help="with --many: atoms per batch (default: 8192)")
    parser.add_argument("--snapshot", type=Path, metavar="FILE",
                        help="with --kernels: write a CUDA memory snapshot of one call")
    args = parser.parse_args()
    if args.upstream and (args.model != "uma" or not args.kernels):
        parser.error("fairchem is profiled with uma --kernels only")
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as folder:  # the model files (UMA-S: 1.1 GB)
        run(args, Path(folder))


def run(args: argparse.Namespace, folder: Path) -> None:
    """What ``main``'s arguments ask for, with the model files written in ``folder``."""
    mode = "default" if args.kernels else None
    if args.model == "pet":
        calc, timer = pet(args.device, mode, args.precision, folder)
    else:  # the UMA-S-shaped checkpoint and fairchem contenders of ``fastcalc bench uma``
        contest = uma_contest(folder, args.device, small=False)
        calc, timer = uma(args.device, mode, args.precision, contest.path)
    if args.many:
        many(calc, args.many, args.max_atoms)
        return
    for natoms in args.sizes:
        if args.kernels:
            print(f"\n#### fastcalc, {natoms} atoms")
            kernels(calc, natoms, args.snapshot)
        else:
            profile(calc, timer, natoms, args.calls)
    if args.upstream:  # after fastcalc's memory is freed, so that the peaks compare
        del calc, timer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        name = "fairchem-tf32" if args.precision == "tf32" else "fairchem"
        upstream = contest.contenders()[name]()
        for natoms in args.sizes:
            print(f"\n#### fairchem, {natoms} atoms")
            kernels(upstream, natoms)


if __name__ == "__main__":
    main()
