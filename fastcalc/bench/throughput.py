"""The ``throughput`` workload: structures per second over a set of structures, each
evaluated once, one at a time and in batches.

A screening asks for many structures' energies, forces and stresses, not for one
structure's again and again. Each implementation is an :data:`Evaluator`: a function
from a list of structures to their energies and forces (stresses are computed too, as
the work asked for, but not compared). After a warm-up pass over the whole set (its
time, compilation included, is recorded apart), timed passes over the same set
alternate between implementations, as calls do in
:func:`~fastcalc.bench.timing.time_calculators`. Beside each rate stand its largest
energy and force differences from an accurate reference on the same structures.
Two sets: many copies of one composition (64-atom fcc copper, rattled), which batches
into few large graphs, and a mix of the ``stream`` workload's structures (bulk cells of
several shapes, slabs with vacuum, a two-element cell), which does not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from ase import Atoms
from ase.calculators.calculator import Calculator, all_changes

from ..calculator import TorchCalculator, even_chunks
from ..tracing import compiled_graphs
from .stream import stream_structures
from .timing import copper, device_name, force_error, synchronize, today

__all__ = [
    "MAX_ATOMS",
    "Evaluator",
    "Results",
    "ThroughputRecord",
    "in_chunks",
    "many_at_once",
    "one_at_a_time",
    "plot_throughput",
    "throughput_sets",
    "throughput_table",
    "time_throughput",
]

#: Energy (eV) and forces (eV/Å) of each structure, in order.
Results = list[tuple[float, np.ndarray]]
#: Evaluates a list of structures (energy, forces and stress) and returns their results.
Evaluator = Callable[[list[Atoms]], Results]

#: Atoms per batch: ``evaluate_many``'s default, given to the upstream batched paths too.
MAX_ATOMS = 8192


@dataclass(frozen=True)
class ThroughputRecord:
    """One implementation over one set of structures.

    ``structures_per_s`` is ``structures`` over the median of ``pass_s`` (each timed pass
    over the whole set); ``first_pass_s`` is the warm-up pass, with building the
    implementation when it was built for it; ``recompiles`` counts graphs compiled during
    the timed passes. ``energy_err_ev`` (largest |E - E_ref| of a structure),
    ``force_err_ev_a`` (largest |F - F_ref| component) and ``force_rel_err`` (that over
    the largest reference force) compare the first timed pass with the reference.
    An implementation that ran out of GPU memory has ``error`` (the message's first line),
    no passes, and NaN rate and errors.
    """

    date: str
    gpu: str
    torch: str
    model: str
    impl: str
    structure_set: str
    structures: int
    atoms: int
    structures_per_s: float
    pass_s: list[float]
    first_pass_s: float
    recompiles: int
    energy_err_ev: float
    force_err_ev_a: float
    force_rel_err: float
    error: str = ""


def throughput_sets(small: bool = False) -> dict[str, list[Atoms]]:
    """The two sets by name: 256 rattled 64-atom fcc copper cells and 64 mixed structures
    (the stream's 13 in turn, 32-500 atoms); with ``small`` 3 of 32 atoms and the stream's
    3 small ones. Every copy is rattled differently."""
    rng = np.random.default_rng(0)
    count = 3 if small else 256
    base = copper(32 if small else 64)
    kinds = [atoms for _, atoms in stream_structures(small)]
    mixed = [kinds[index % len(kinds)] for index in range(3 if small else 64)]
    sizes = [len(atoms) for atoms in mixed]
    sets = {
        f"fcc Cu {len(base)} atoms x {count}": [base] * count,
        f"mixed {min(sizes)}-{max(sizes)} atoms x {len(mixed)}": mixed,
    }
    rattled = {}
    for name, structures in sets.items():
        rattled[name] = []
        for atoms in structures:
            copy = atoms.copy()
            copy.positions += rng.normal(0.0, 0.02, copy.positions.shape)
            rattled[name].append(copy)
    return rattled


def one_at_a_time(calc: Calculator) -> Evaluator:
    """The calculator on each structure in turn through ASE (energy, forces, stress)."""

    def evaluate(structures: list[Atoms]) -> Results:
        results = []
        for atoms in structures:
            calc.calculate(atoms, ["energy", "forces", "stress"], all_changes)
            results.append((float(calc.results["energy"]), calc.results["forces"]))
        return results

    return evaluate


def many_at_once(calc: TorchCalculator) -> Evaluator:
    """``calc.evaluate_many`` on the whole list (batches of at most ``MAX_ATOMS`` atoms)."""

    def evaluate(structures: list[Atoms]) -> Results:
        results = calc.evaluate_many(structures, max_atoms=MAX_ATOMS)
        for result in results:
            if "error" in result:
                raise result["error"]
        return [(float(result["energy"]), result["forces"]) for result in results]

    return evaluate


def in_chunks(evaluate: Evaluator, max_atoms: int = MAX_ATOMS) -> Evaluator:
    """``evaluate`` on consecutive runs of at most ``max_atoms`` atoms (a larger structure
    alone) spread evenly, as ``evaluate_many`` cuts its batches: an upstream batched path
    given the same batch sizes."""

    def chunked(structures: list[Atoms]) -> Results:
        results: Results = []
        for chunk in even_chunks(structures, len, max_atoms):
            results += evaluate(chunk)
        return results

    return chunked


def _timed(evaluate: Evaluator, structures: list[Atoms]) -> tuple[float, Results]:
    """Seconds of one synchronised pass over ``structures``, and its results."""
    synchronize()
    start = time.perf_counter()
    results = evaluate(structures)
    synchronize()
    return time.perf_counter() - start, results


def _errors(results: Results, reference: Results) -> tuple[float, float, float]:
    """Largest energy difference, largest force difference and that relative to the
    largest reference force, over all structures."""
    energy = max(abs(e - e_ref) for (e, _), (e_ref, _) in zip(results, reference))
    forces = np.concatenate([np.asarray(f, dtype=np.float64) for _, f in results])
    exact = np.concatenate([f for _, f in reference])
    return energy, float(np.abs(forces - exact).max()), force_error(forces, exact)


def time_throughput(
    evaluators: dict[str, Callable[[], Evaluator]],
    structures: list[Atoms],
    model: str,
    structure_set: str,
    *,
    reference: Callable[[], Evaluator],
    passes: int = 3,
    progress: Callable[[Iterable], Iterable] = iter,
) -> list[ThroughputRecord]:
    """Time each evaluator factory over ``structures``; one record per implementation.

    ``reference`` (an accurate evaluator, built and dropped before the others) gives the
    results that each implementation's first timed pass is compared with.
    """
    make = reference()
    exact = [(float(e), np.asarray(f, dtype=np.float64)) for e, f in make(structures)]
    del make
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    built: dict[str, Evaluator] = {}
    first_pass: dict[str, float] = {}
    failed: dict[str, str] = {}

    def out_of_memory(name: str, error: torch.OutOfMemoryError) -> None:
        """Drop implementation ``name``, which ran out of GPU memory, and go on."""
        failed[name] = str(error).splitlines()[0]
        built.pop(name, None)
        torch.cuda.empty_cache()
        print(f"{model}, {structure_set}: {name} ran out of GPU memory; recorded as failed "
              f"({failed[name]})", flush=True)

    for name, factory in evaluators.items():
        start = time.perf_counter()
        try:
            built[name] = factory()
            _timed(built[name], structures)
        except torch.OutOfMemoryError as error:
            out_of_memory(name, error)
        first_pass[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in evaluators}
    errors: dict[str, tuple[float, float, float]] = {}
    recompiles = dict.fromkeys(evaluators, 0)
    for _ in progress(range(passes)):
        for name, evaluate in list(built.items()):
            graphs = compiled_graphs()
            try:
                seconds, results = _timed(evaluate, structures)
            except torch.OutOfMemoryError as error:
                out_of_memory(name, error)
                continue
            recompiles[name] += compiled_graphs() - graphs
            times[name].append(seconds)
            errors.setdefault(name, _errors(results, exact))
    for name in failed:  # a failed implementation's passes and errors do not count
        times[name], errors[name] = [], (math.nan, math.nan, math.nan)
    return [
        ThroughputRecord(
            date=today(),
            gpu=device_name(),
            torch=torch.__version__,
            model=model,
            impl=name,
            structure_set=structure_set,
            structures=len(structures),
            atoms=sum(len(atoms) for atoms in structures),
            structures_per_s=(
                len(structures) / float(np.median(times[name])) if times[name] else math.nan
            ),
            pass_s=times[name],
            first_pass_s=first_pass[name],
            recompiles=recompiles[name],
            energy_err_ev=errors[name][0],
            force_err_ev_a=errors[name][1],
            force_rel_err=errors[name][2],
            error=failed.get(name, ""),
        )
        for name in evaluators
    ]


def throughput_table(records: Iterable[ThroughputRecord]) -> str:
    """Markdown table, one row per record: the rate beside its accuracy."""
    rows = [
        "| model | structures | impl | structures/s | first pass s | max dE eV | max dF eV/A "
        "| force rel. err | recompiles |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows += [
        f"| {r.model} | {r.structure_set} | {r.impl} | {r.structures_per_s:.1f} "
        f"| {r.first_pass_s:.1f} | {r.energy_err_ev:.1e} | {r.force_err_ev_a:.1e} "
        f"| {r.force_rel_err:.1e} | {r.recompiles} |"
        if not r.error
        else f"| {r.model} | {r.structure_set} | {r.impl} | failed: {r.error} | | | | | |"
        for r in records
    ]
    return "\n".join(rows)


def plot_throughput(records: Iterable[ThroughputRecord], path: str | Path) -> None:
    """Structures per second, one horizontal bar per (model, implementation), one panel
    per set; each bar labelled with its rate and its relative force error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    sets = list(dict.fromkeys(r.structure_set for r in records))
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4), squeeze=False)
    for ax, name in zip(axes[0], sets):
        # the first at the top; those that failed have no rate to draw
        rows = [r for r in records if r.structure_set == name and not r.error][::-1]
        bars = ax.barh([f"{r.model}: {r.impl}" for r in rows],
                       [r.structures_per_s for r in rows])
        ax.bar_label(bars, [f" {r.structures_per_s:.1f}/s, F err {r.force_rel_err:.0e}"
                            for r in rows], fontsize=8)
        ax.set(xlabel="structures per second (E+F+S)", title=name,
               xlim=(0, 1.6 * max((r.structures_per_s for r in rows), default=1.0)))
    fig.suptitle(f"throughput on {records[0].gpu if records else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
