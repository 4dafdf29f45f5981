"""Side-by-side timing of ASE calculators: one process, same structures, alternating calls.

Each call is one energy + forces + stress evaluation of rattled fcc copper whose
positions get a fresh small random displacement (as in an MD step), the same
displacements for every implementation. Warm-up calls come first, one
implementation at a time, then the timed calls alternate between implementations
so that a shared machine's load affects all of them alike. The forces of the first
timed call are compared with an accurate reference's on the same positions, so that
each time is reported next to the accuracy it was bought with.
"""

from __future__ import annotations

import datetime
import gc
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.calculator import Calculator, all_changes

from ..tracing import compiled_graphs

__all__ = [
    "BenchRecord",
    "copper",
    "device_name",
    "force_error",
    "plot_records",
    "ratio_table",
    "reference_forces",
    "synchronize",
    "time_calculators",
    "timed_call",
    "today",
    "write_records",
]

#: Repeats of the cubic 4-atom fcc cell for the benchmarked atom counts.
COPPER_REPEATS = {32: (2, 2, 2), 64: (2, 2, 4), 108: (3, 3, 3), 256: (4, 4, 4), 1008: (6, 6, 7)}


@dataclass(frozen=True)
class BenchRecord:
    """One implementation on one structure: per-call times, first-call cost and force error
    (``force_rel_err``: max |F - F_ref| / max |F_ref| against an accurate reference)."""

    date: str
    gpu: str
    torch: str
    model: str
    natoms: int
    impl: str
    median_ms: float
    p90_ms: float
    force_rel_err: float
    warmup_s: float
    peak_mem_gib: float
    recompiles: int


def copper(natoms: int) -> Atoms:
    """Rattled fcc copper (a = 3.61 Å) with ``natoms`` atoms (a key of COPPER_REPEATS)."""
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(COPPER_REPEATS[natoms])
    atoms.rattle(0.05, seed=0)
    return atoms


def device_name() -> str:
    """The CUDA device's name, or ``"cpu"``."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def today() -> str:
    """Today's UTC date, the records' ``date``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def synchronize() -> None:
    """Wait for the CUDA device's queued work (nothing on the CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_call(calc: Calculator, atoms: Atoms) -> float:
    """Seconds of one synchronised energy + forces + stress evaluation of ``atoms``."""
    synchronize()
    start = time.perf_counter()
    calc.calculate(atoms, ["energy", "forces", "stress"], all_changes)
    synchronize()
    return time.perf_counter() - start


def reference_forces(factory: Callable[[], Calculator], atoms: Atoms) -> np.ndarray:
    """Forces on ``atoms`` from a calculator built for this one evaluation and freed.

    Calculators can sit in reference cycles (fastcalc's do), which ``del`` leaves to
    Python's cyclic collector: run at some later allocation, it would free the reference's
    GPU memory during another calculator's warm-up and make that one's measured peak too
    small (down to nothing). So the collector runs here."""
    calc = factory()
    calc.calculate(atoms, ["energy", "forces"], all_changes)
    forces = np.array(calc.results["forces"], dtype=np.float64)
    del calc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return forces


def force_error(forces: np.ndarray, reference: np.ndarray) -> float:
    """max |F - F_ref| / max |F_ref|: the largest force error against the largest force."""
    return float(np.abs(forces - reference).max() / max(np.abs(reference).max(), 1e-12))


def time_calculators(
    calculators: dict[str, Callable[[], Calculator]],
    atoms: Atoms,
    model: str,
    *,
    reference: Callable[[], Calculator],
    warmup: int = 3,
    calls: int = 20,
    seed: int = 1,
    progress: Callable[[Iterable], Iterable] = iter,
) -> list[BenchRecord]:
    """Time each calculator factory on ``atoms``; one record per implementation.

    ``warmup_s`` covers building the calculator and its warm-up calls (so it
    includes compilation); ``peak_mem_gib`` is the CUDA memory allocated during
    them above what was allocated before (0 on CPU); ``recompiles`` counts graphs
    compiled during the timed calls, which should be none. ``force_rel_err``
    compares the forces of the first timed call with those of ``reference`` (an
    accurate calculator, built once before the others) on the same positions.
    """
    rng = np.random.default_rng(seed)
    base = atoms.positions.copy()
    displacements = rng.normal(0.0, 0.01, (warmup + calls, *base.shape))

    def moved(step: int) -> Atoms:
        copy = atoms.copy()
        copy.positions = base + displacements[step]
        return copy

    exact = reference_forces(reference, moved(warmup))
    built: dict[str, Calculator] = {}
    warm: dict[str, tuple[float, float]] = {}
    for name, factory in calculators.items():
        gc.collect()  # garbage freed during the warm-up would hide memory it allocates
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        built[name] = factory()
        for step in range(warmup):
            timed_call(built[name], moved(step))
        seconds = time.perf_counter() - start
        peak = (torch.cuda.max_memory_allocated() - before) / 2**30 if torch.cuda.is_available() else 0.0
        warm[name] = (seconds, peak)
    times: dict[str, list[float]] = {name: [] for name in calculators}
    errors: dict[str, float] = {}
    recompiles = dict.fromkeys(calculators, 0)
    for step in progress(range(warmup, warmup + calls)):
        for name, calc in built.items():
            graphs = compiled_graphs()
            times[name].append(timed_call(calc, moved(step)))
            recompiles[name] += compiled_graphs() - graphs
            if name not in errors:
                errors[name] = force_error(np.asarray(calc.results["forces"]), exact)
    return [
        BenchRecord(
            date=today(),
            gpu=device_name(),
            torch=torch.__version__,
            model=model,
            natoms=len(atoms),
            impl=name,
            median_ms=float(np.median(times[name]) * 1e3),
            p90_ms=float(np.percentile(times[name], 90) * 1e3),
            force_rel_err=errors[name],
            warmup_s=warm[name][0],
            peak_mem_gib=warm[name][1],
            recompiles=recompiles[name],
        )
        for name in calculators
    ]


def write_records(records: Iterable[object], path: str | Path) -> None:
    """Write records (dataclasses: ``BenchRecord``, ``StreamRecord``) as a JSON list,
    making its folder: a run that stops before its first record leaves no folder behind."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps([asdict(r) for r in records], indent=1) + "\n")


def plot_records(records: Iterable[BenchRecord], path: str | Path) -> None:
    """ms per call against atom count, one line per (model, implementation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    models = sorted({r.model for r in records})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for impl in sorted({r.impl for r in records if r.model == model}):
            rows = sorted((r.natoms, r.median_ms) for r in records if (r.model, r.impl) == (model, impl))
            ax.plot(*zip(*rows), marker="o", label=impl)
        ax.set(xscale="log", yscale="log", xlabel="atoms", ylabel="ms per call (E+F+S)", title=model)
        ax.legend()
    device = records[0].gpu if records else ""
    fig.suptitle(f"median time per call on {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def ratio_table(records: Iterable[BenchRecord], upstream: str, ours: str = "fastcalc") -> str:
    """Markdown table, one row per atom count: both times, the ratio, both force errors,
    warm-up and memory."""
    rows = [
        f"| atoms | {upstream} ms | {ours} ms | ratio | force rel. err ({upstream} / {ours}) "
        f"| warm-up s ({upstream} / {ours}) | peak GiB ({upstream} / {ours}) | recompiles |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_size: dict[int, dict[str, BenchRecord]] = {}
    for record in records:
        by_size.setdefault(record.natoms, {})[record.impl] = record
    for natoms, pair in sorted(by_size.items()):
        theirs, mine = pair[upstream], pair[ours]
        rows.append(
            f"| {natoms} | {theirs.median_ms:.2f} | {mine.median_ms:.2f} "
            f"| {theirs.median_ms / mine.median_ms:.2f}x "
            f"| {theirs.force_rel_err:.1e} / {mine.force_rel_err:.1e} "
            f"| {theirs.warmup_s:.1f} / {mine.warmup_s:.1f} "
            f"| {theirs.peak_mem_gib:.2f} / {mine.peak_mem_gib:.2f} | {mine.recompiles} |"
        )
    return "\n".join(rows)
