"""The ``stream`` workload: one calculator per implementation over many different structures.

MD on one structure lets a calculator compile once and replay; a screening or a
high-throughput workflow hands the same calculator one structure after another.
Each implementation is built once and evaluates every structure of a fixed list
(bulk cells of several shapes, slabs with vacuum, a two-element cell), ``calls``
times each with freshly displaced positions; the calls alternate between
implementations as in :func:`~fastcalc.bench.timing.time_calculators`. The time
to build a calculator counts, since compiling for new shapes is the cost measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from ase import Atoms
from ase.build import bulk, fcc100, fcc110, fcc111
from ase.calculators.calculator import Calculator

from .timing import device_name, timed_call, today

__all__ = ["StreamRecord", "plot_stream", "stream_structures", "time_stream"]

#: The second element of the two-element structure (the PET random model knows it too).
SECOND_ELEMENT = "Ag"
_A_FCC = 3.61  # Cu
_A_BCC = (_A_FCC**3 / 2) ** (1 / 3)  # the fcc volume per atom
_A_HCP = _A_FCC / np.sqrt(2)  # ideal c/a: the fcc nearest-neighbour distance and volume


@dataclass(frozen=True)
class StreamRecord:
    """One implementation over the whole stream: ``total_s`` from building the calculator
    to the last result, ``first_result_s`` to the first; ``call_s`` each call's seconds."""

    date: str
    gpu: str
    torch: str
    model: str
    impl: str
    structures: int
    calls: int
    total_s: float
    first_result_s: float
    call_s: list[float]


def _sheared(atoms: Atoms) -> Atoms:
    """``atoms`` in a triclinic cell: sheared by 8 % in xy and 5 % in xz, atoms following."""
    strain = np.array([[1.0, 0.08, 0.05], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    atoms.set_cell(atoms.cell.array @ strain, scale_atoms=True)
    return atoms


def _cu3ag(repeat: tuple[int, int, int]) -> Atoms:
    """L1_2 Cu3Ag: fcc cubic cells (a = 3.8 Å) with the corner atom of each made silver."""
    atoms = bulk("Cu", "fcc", a=3.8, cubic=True).repeat(repeat)
    atoms.symbols[::4] = SECOND_ELEMENT
    return atoms


def _slab(build: Callable[..., Atoms], size: tuple[int, int, int]) -> Atoms:
    """A copper slab with 2 x 8 Å of vacuum, periodic along all three axes (as in plane-wave
    calculations), so that stress is defined; images are farther apart than any cutoff."""
    atoms = build("Cu", size, a=_A_FCC, vacuum=8.0)
    atoms.pbc = True
    return atoms


def stream_structures(small: bool = False) -> list[tuple[str, Atoms]]:
    """The fixed list of (name, structure), 32-500 atoms, rattled; with ``small`` three small
    ones (a cubic cell, a slab, the two-element cell) for a smoke test."""
    cubic = bulk("Cu", "fcc", a=_A_FCC, cubic=True)
    primitive = bulk("Cu", "fcc", a=_A_FCC)
    if small:
        structures = [
            ("fcc cubic 2x2x2", cubic.repeat((2, 2, 2))),
            ("fcc(111) slab 2x2x3", _slab(fcc111, (2, 2, 3))),
            ("Cu3Ag 2x2x2", _cu3ag((2, 2, 2))),
        ]
    else:
        structures = [
            ("fcc cubic 2x2x2", cubic.repeat((2, 2, 2))),
            ("fcc cubic 3x3x3", cubic.repeat((3, 3, 3))),
            ("fcc primitive 4x4x4", primitive.repeat((4, 4, 4))),
            ("bcc cubic 4x4x4", bulk("Cu", "bcc", a=_A_BCC, cubic=True).repeat((4, 4, 4))),
            ("hcp 4x4x3", bulk("Cu", "hcp", a=_A_HCP).repeat((4, 4, 3))),
            ("fcc(111) slab 4x4x4", _slab(fcc111, (4, 4, 4))),
            ("fcc(100) slab 5x5x4", _slab(fcc100, (5, 5, 4))),
            ("fcc primitive 5x5x6", primitive.repeat((5, 5, 6))),
            ("fcc cubic sheared 3x3x4", _sheared(cubic.repeat((3, 3, 4)))),
            ("fcc(110) slab 4x4x6", _slab(fcc110, (4, 4, 6))),
            ("Cu3Ag 4x4x4", _cu3ag((4, 4, 4))),
            ("fcc cubic 4x4x4", cubic.repeat((4, 4, 4))),
            ("fcc cubic 5x5x5", cubic.repeat((5, 5, 5))),
        ]
    for _, atoms in structures:
        atoms.rattle(0.05, seed=0)
    return structures


def time_stream(
    calculators: dict[str, Callable[[], Calculator]],
    structures: list[Atoms],
    model: str,
    *,
    calls: int = 10,
    seed: int = 1,
    progress: Callable[[Iterable], Iterable] = iter,
) -> list[StreamRecord]:
    """Build each calculator once and time it over ``structures``, ``calls`` displaced
    evaluations each; one record per implementation."""
    rng = np.random.default_rng(seed)
    build_s: dict[str, float] = {}
    built: dict[str, Calculator] = {}
    for name, factory in calculators.items():
        start = time.perf_counter()
        built[name] = factory()
        build_s[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in calculators}
    steps = [(atoms, step) for atoms in structures for step in range(calls)]
    for atoms, _ in progress(steps):
        moved = atoms.copy()
        moved.positions += rng.normal(0.0, 0.01, atoms.positions.shape)
        for name, calc in built.items():
            times[name].append(timed_call(calc, moved))
    return [
        StreamRecord(
            date=today(),
            gpu=device_name(),
            torch=torch.__version__,
            model=model,
            impl=name,
            structures=len(structures),
            calls=len(steps),
            total_s=build_s[name] + sum(times[name]),
            first_result_s=build_s[name] + times[name][0],
            call_s=times[name],
        )
        for name in calculators
    ]


def plot_stream(records: Iterable[StreamRecord], path: str | Path) -> None:
    """Seconds since building the calculator against calls, one line per (model, impl)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    fig, ax = plt.subplots(figsize=(6, 4))
    for record in records:
        build = record.first_result_s - record.call_s[0]
        elapsed = build + np.cumsum(record.call_s)
        ax.plot(np.arange(1, record.calls + 1), elapsed, label=f"{record.model}: {record.impl}")
    structures = records[0].structures if records else 0
    ax.set(xlabel="calls", ylabel="seconds since building the calculator", yscale="log",
           title=f"{structures} structures on {records[0].gpu if records else ''}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
