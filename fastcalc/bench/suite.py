"""``fastcalc bench``: fastcalc against the upstream calculator on the same random model.

For each model the upstream side builds a random-weight model (PET-S- or UMA-S-shaped,
or a tiny one for a smoke test) and eager fastcalc and the eager upstream calculator
are checked to agree. Two workloads, everything in float32 with TF32 off:

- ``sizes`` (``run_benchmark``): ``time_calculators`` on rattled fcc copper at each
  size, each time next to its force error against eager float64 fastcalc; records in
  ``{out}/{pet,uma}.json`` and a plot next to them.
- ``stream`` (``run_stream``): ``time_stream``, one calculator per implementation over
  a list of different structures, built as a user's script builds it (fastcalc's
  compiling in the background); records in ``{out}/stream.json`` and ``stream.png``.
- ``first-result`` (``run_first_result``): ``time_first_results``, fresh processes from
  start to first result, compile caches cold and warm; records in
  ``{out}/first_result.json``.
- ``throughput`` (``run_throughput``): ``time_throughput``, structures per second over two
  sets, fastcalc one at a time and through ``evaluate_many`` against the upstream's
  batched path; records in ``{out}/throughput.json`` and ``throughput.png``.

- PET: metatrain's PET (Cu and Ag), exported to a metatomic ``.pt``. fastcalc's
  ``CompiledPETCalculator`` (default compile mode: CUDA graphs on CUDA) against
  metatomic's calculator (its eager TorchScript model). One calculator of each kind
  serves every size, so fastcalc's first ``warmup_s`` includes compiling the model (the
  timed calculators compile at their first call, not in the background).
- UMA: a fairchem inference checkpoint built with fairchem's classes, omat task.
  fastcalc's ``BucketedCalculator`` (default compile mode: CUDA graphs on CUDA) against
  fairchem's calculator with its ``high-precision`` preset as a user gets it
  (``fairchem``: merged experts, torch.compile, the backend fairchem picks) and the
  same preset on the general backend (``fairchem-general``). One calculator of each
  kind serves every size, so the first ``warmup_s`` includes compiling.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from ase import Atoms
from ase.calculators.calculator import Calculator

from ..pet import CompiledPETCalculator
from ..progress import progress_bar
from ..registry import families
from ..uma import BucketedCalculator
from .first_result import FirstResultRecord, time_first_results
from .stream import StreamRecord, plot_stream, stream_structures, time_stream
from .throughput import (
    Evaluator,
    ThroughputRecord,
    in_chunks,
    many_at_once,
    one_at_a_time,
    plot_throughput,
    throughput_sets,
    throughput_table,
    time_throughput,
)
from .timing import (
    BenchRecord,
    copper,
    force_error,
    plot_records,
    ratio_table,
    time_calculators,
    write_records,
)
from .upstream import (
    build_checkpoint,
    default_backbone,
    export_pet,
    fairchem_batched,
    fairchem_calculator,
    fairchem_preset_calculator,
    metatomic_batched,
    metatomic_calculator,
)

__all__ = [
    "MODELS",
    "Agreement",
    "Contest",
    "check_agreement",
    "pet_contest",
    "run_benchmark",
    "run_first_result",
    "run_stream",
    "run_throughput",
    "uma_contest",
]

T = TypeVar("T")

#: PET-S-shaped: 3 GNN layers of one attention layer, adaptive cutoffs of 16 neighbours.
PET_S = dict(
    d_pet=256, d_node=512, d_head=256, d_feedforward=512, num_heads=8, num_gnn_layers=3,
    num_attention_layers=1, cutoff=8.0, num_neighbors_adaptive=16,
)
PET_TINY = dict(
    d_pet=16, d_node=32, d_head=16, d_feedforward=32, num_heads=2, num_gnn_layers=1,
    num_attention_layers=1, cutoff=8.0, num_neighbors_adaptive=16,
)
#: UMA-S-shaped: 4 layers, 128 channels, lmax = mmax = 2, 32 experts, cutoff 6 Å.
UMA_S = dict(
    sphere_channels=128, hidden_channels=128, edge_channels=128, num_distance_basis=64,
    num_layers=4, lmax=2, mmax=2, num_experts=32, cutoff=6.0, max_neighbors=300,
    use_composition_embedding=True, chg_spin_emb_type="rand_emb", moe_dropout=0.0,
)
UMA_TINY = dict(
    sphere_channels=8, hidden_channels=8, edge_channels=8, num_distance_basis=8,
    num_layers=1, lmax=1, mmax=1, num_experts=4, cutoff=4.0, max_neighbors=300,
)

#: Largest relative differences (energy; forces and stress against their largest
#: component) at which eager fastcalc and upstream still count as the same model.
TOLERANCE = {"energy": 1e-3, "forces": 1e-2, "stress": 1e-2}


@dataclass(frozen=True)
class Contest:
    """One model's benchmark: the record names and the calculators to compare.

    ``contenders`` are the timed calculators (the headline upstream first, fastcalc
    last); ``pairs`` lists the (upstream, fastcalc) contenders compared in the printed
    tables; ``streamed`` builds the calculators that the ``stream`` workload runs, each
    as a user's script builds it (fastcalc compiling in the background); ``batched``
    builds the upstream's batched path for the ``throughput`` workload, and
    ``batched_tf32`` that path in TF32, against fastcalc's ``fastcalc-tf32`` contender.
    """

    model: str
    path: Path  # the model file
    upstream: str
    reference: Callable[[], Calculator]  # eager upstream, for the agreement check
    eager: Callable[[], Calculator]  # eager fastcalc, for the agreement check
    accurate: Callable[[], Calculator]  # eager float64 fastcalc, for the force errors
    contenders: Callable[[], dict[str, Callable[[], Calculator]]]  # timed, for one size
    pairs: tuple[tuple[str, str], ...]
    streamed: dict[str, Callable[[], Calculator]]
    batched: Callable[[], Evaluator]
    batched_tf32: Callable[[], Evaluator]


#: fastcalc's timed calculators compile at their first call rather than in the background,
#: so that warm-up calls leave them compiled.
_TIMED = {"compile_in_background": False}


def _once(factory: Callable[[], Calculator]) -> Callable[[], Calculator]:
    """A factory that builds its calculator at the first call and returns it from then on."""
    built: list[Calculator] = []

    def get() -> Calculator:
        if not built:
            built.append(factory())
        return built[0]

    return get


def pet_contest(folder: Path, device: str, small: bool) -> Contest:
    """PET-S-shaped (or tiny) PET exported into ``folder``; one calculator of each kind."""
    path = export_pet(PET_TINY if small else PET_S, folder / "pet.pt", seed=0)
    factories = {
        "metatomic": _once(lambda: metatomic_calculator(path, device)),
        "fastcalc-tf32": _once(
            lambda: CompiledPETCalculator(path, device=device, precision="tf32", **_TIMED)
        ),
        "fastcalc": _once(lambda: CompiledPETCalculator(path, device=device, **_TIMED)),
    }
    return Contest(
        model="pet-tiny-random" if small else "pet-s-random",
        path=path,
        upstream="metatomic",
        reference=lambda: metatomic_calculator(path, device),
        eager=lambda: CompiledPETCalculator(path, device=device, compile_mode="eager"),
        accurate=lambda: CompiledPETCalculator(
            path, device=device, dtype="float64", compile_mode="eager"
        ),
        contenders=lambda: factories,
        pairs=(("metatomic", "fastcalc"),),
        streamed={"metatomic": factories["metatomic"],
                  "fastcalc": lambda: CompiledPETCalculator(path, device=device)},
        batched=lambda: metatomic_batched(path, device),
        batched_tf32=lambda: metatomic_batched(path, device, tf32=True),
    )


def uma_contest(folder: Path, device: str, small: bool) -> Contest:
    """UMA-S-shaped (or tiny) checkpoint saved in ``folder``; one calculator of each kind
    serves every size, as one does in a user's script (fastcalc compiles once for all
    sizes, fairchem's compiled model is dynamic too).

    ``fairchem`` is the ``high-precision`` preset as fairchem picks its backend
    (``umas_fast_gpu`` on CUDA for lmax = mmax = 2), ``fairchem-general`` the same
    preset on the general backend, ``fairchem-tf32`` the ``multigpu`` preset (TF32,
    backend left to fairchem); fastcalc runs its default mode (CUDA graphs on CUDA, eager
    on CPU), in float32 and, as ``fastcalc-tf32`` and ``fastcalc-3xtf32``, with
    ``precision="tf32"`` and ``"3xtf32"`` (the latter against fairchem's float32).
    """
    path = folder / "uma.pt"
    backbone = default_backbone(**(UMA_TINY if small else UMA_S))
    build_checkpoint(path, backbone, "UMA-S-1.2.1", seed=0)
    factories = {
        "fairchem": _once(lambda: fairchem_preset_calculator(path, "omat", device)),
        "fairchem-general": _once(
            lambda: fairchem_preset_calculator(path, "omat", device, execution_mode="general")
        ),
        "fairchem-tf32": _once(
            lambda: fairchem_preset_calculator(path, "omat", device, preset="multigpu")
        ),
        "fastcalc-tf32": _once(
            lambda: BucketedCalculator(path, task_name="omat", device=device, precision="tf32",
                               **_TIMED)
        ),
        "fastcalc-3xtf32": _once(
            lambda: BucketedCalculator(path, task_name="omat", device=device, precision="3xtf32",
                               **_TIMED)
        ),
        "fastcalc": _once(
            lambda: BucketedCalculator(path, task_name="omat", device=device, **_TIMED)
        ),
    }
    return Contest(
        model="uma-tiny-random" if small else "uma-s-random",
        path=path,
        upstream="fairchem",
        reference=lambda: fairchem_calculator(path, "omat", torch.float32, device),
        eager=lambda: BucketedCalculator(
            path, task_name="omat", device=device, compile_mode="eager"
        ),
        accurate=lambda: BucketedCalculator(
            path, task_name="omat", device=device, dtype="float64", compile_mode="eager"
        ),
        contenders=lambda: factories,
        pairs=(
            ("fairchem", "fastcalc"), ("fairchem-general", "fastcalc"),
            ("fairchem-tf32", "fastcalc-tf32"), ("fairchem", "fastcalc-3xtf32"),
        ),
        streamed={"fairchem": factories["fairchem"],
                  "fastcalc": lambda: BucketedCalculator(path, task_name="omat", device=device)},
        batched=lambda: fairchem_batched(path, "omat", device),
        batched_tf32=lambda: fairchem_batched(path, "omat", device, preset="multigpu"),
    )


#: The benchmarked models by command-line name: the registered families' contests.
MODELS: dict[str, Callable[[Path, str, bool], Contest]] = {
    name: family.contest for name, family in families().items() if family.contest is not None
}


@contextmanager
def _contest(name: str, device: str, small: bool) -> Iterator[Contest]:
    """Model ``name``'s contest (a key of ``MODELS``), its files in a temporary folder,
    with fastcalc's note that it compiles at the first call silenced."""
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*compiles the model at its first call.*")
        yield MODELS[name](Path(folder), device, small)


@dataclass(frozen=True)
class Agreement:
    """Relative differences of fastcalc from upstream on one structure."""

    energy: float
    forces: float
    stress: float

    def __str__(self) -> str:
        return f"energy {self.energy:.1e}, forces {self.forces:.1e}, stress {self.stress:.1e}"


def _results(calculator: Calculator, atoms: Atoms) -> tuple[float, np.ndarray, np.ndarray]:
    atoms = atoms.copy()
    atoms.calc = calculator
    return atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()


def check_agreement(upstream: Calculator, ours: Calculator, atoms: Atoms) -> Agreement:
    """Relative differences of ``ours`` from ``upstream`` on ``atoms``; raises if they
    exceed ``TOLERANCE``, since the timings would then compare different models."""
    energy, forces, stress = _results(upstream, atoms)
    our_energy, our_forces, our_stress = _results(ours, atoms)
    agreement = Agreement(
        energy=abs(our_energy - energy) / max(abs(energy), 1.0),
        forces=force_error(our_forces, forces),
        stress=force_error(our_stress, stress),
    )
    if any(getattr(agreement, name) > limit for name, limit in TOLERANCE.items()):
        raise RuntimeError(
            f"fastcalc and the upstream calculator disagree on {len(atoms)} atoms "
            f"(relative differences: {agreement}; tolerated: {TOLERANCE}): "
            "they do not run the same model"
        )
    return agreement


def _torch_settings() -> None:
    """TF32 off everywhere; room for fairchem's dynamic compile to need a graph per size."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch._dynamo.config.recompile_limit = 64


def _bar(label: str) -> Callable[[Iterable], Iterable]:
    """A progress bar over the timed calls."""
    return lambda steps: progress_bar(iterable=steps, desc=label, unit="call", leave=False)


class UnknownContenderError(ValueError):
    """A contender name that the model's contest does not have."""


def chosen(factories: dict[str, T], names: Iterable[str] | None) -> dict[str, T]:
    """The contenders ``names`` of ``factories`` (all of them for None), in their order."""
    if names is None:
        return factories
    unknown = sorted(set(names) - set(factories))
    if unknown:
        raise UnknownContenderError(
            f"no contender {', '.join(unknown)} here; choose from {', '.join(factories)}"
        )
    return {name: factory for name, factory in factories.items() if name in names}


def run_benchmark(
    name: str,
    *,
    device: str,
    sizes: list[int],
    calls: int,
    warmup: int,
    out: Path,
    small: bool = False,
    contenders: list[str] | None = None,
) -> list[BenchRecord]:
    """Benchmark model ``name`` (a key of ``MODELS``) and write ``{out}/{name}.json`` and
    ``.png``; the records are rewritten after each size, so a failure keeps earlier ones.
    ``contenders`` times only those of the contest (default: all)."""
    _torch_settings()
    path = out / f"{name}.json"
    records: list[BenchRecord] = []
    with _contest(name, device, small) as contest:
        factories = chosen(contest.contenders(), contenders)
        agreement = check_agreement(contest.reference(), contest.eager(), copper(sizes[0]))
        print(f"{contest.model}: eager fastcalc against {contest.upstream} (float32, "
              f"{sizes[0]} atoms), relative differences {agreement}", flush=True)
        for natoms in sizes:
            records += time_calculators(
                factories, copper(natoms), contest.model,
                reference=contest.accurate, warmup=warmup, calls=calls,
                progress=_bar(f"{contest.model}, {natoms} atoms"),
            )
            write_records(records, path)
    plot_records(records, path.with_suffix(".png"))
    tables = "\n\n".join(
        ratio_table(records, *pair) for pair in contest.pairs if set(pair) <= set(factories)
    )
    print(f"\n{contest.model} on {records[0].gpu}, torch {records[0].torch}: wrote {path} "
          f"and {path.with_suffix('.png').name}; force errors against eager float64 fastcalc"
          f"\n\n{tables}\n", flush=True)
    return records


def run_stream(
    names: list[str], *, device: str, calls: int, out: Path, small: bool = False
) -> list[StreamRecord]:
    """The ``stream`` workload for models ``names`` (keys of ``MODELS``): write
    ``{out}/stream.json`` (rewritten after each model) and ``stream.png``."""
    _torch_settings()
    path = out / "stream.json"
    structures = stream_structures(small)
    records: list[StreamRecord] = []
    for name in names:
        with _contest(name, device, small) as contest:
            reference, eager = contest.reference(), contest.eager()
            worst = max((check_agreement(reference, eager, atoms) for _, atoms in structures),
                        key=lambda agreement: agreement.forces)
            print(f"{contest.model}: eager fastcalc against {contest.upstream} (float32) on "
                  f"{len(structures)} structures, largest force difference: {worst}", flush=True)
            del reference, eager
            records += time_stream(
                contest.streamed,
                [atoms for _, atoms in structures], contest.model, calls=calls,
                progress=_bar(f"{contest.model}, stream"),
            )
        write_records(records, path)
    plot_stream(records, path.with_suffix(".png"))
    rows = "\n".join(
        f"| {r.model} | {r.impl} | {r.calls} | {r.first_result_s:.1f} | {r.total_s:.1f} |"
        for r in records
    )
    print(f"\nstream of {len(structures)} structures on {records[0].gpu}, torch "
          f"{records[0].torch}: wrote {path} and {path.with_suffix('.png').name}\n\n"
          "| model | impl | calls | first result s | total s |\n|---|---|---:|---:|---:|\n"
          f"{rows}\n", flush=True)
    return records


#: Atom counts of the ``first-result`` workload (the issue's targets: PET at 64, UMA at 108).
FIRST_RESULT_ATOMS = {"pet": 64, "uma": 108}


def run_first_result(
    names: list[str], *, device: str, out: Path, small: bool = False,
    contenders: list[str] | None = None,
) -> list[FirstResultRecord]:
    """The ``first-result`` workload for models ``names`` (keys of ``MODELS``): write
    ``{out}/first_result.json`` (rewritten after each model) and print a table.
    ``contenders`` times only those of fastcalc and the upstream (default: both)."""
    path = out / "first_result.json"
    records: list[FirstResultRecord] = []
    for name in names:
        with tempfile.TemporaryDirectory() as folder:
            contest = MODELS[name](Path(folder), device, small)
            natoms = 32 if small else FIRST_RESULT_ATOMS.get(name, 64)
            impls = list(chosen(dict.fromkeys(("fastcalc", contest.upstream)), contenders))
            records += time_first_results(
                name, contest.model, contest.path, impls, device, natoms, Path(folder),
            )
        write_records(records, path)
    rows = "\n".join(
        f"| {r.model} | {r.natoms} | {r.impl} | {r.cache} | {r.first_result_s:.1f} "
        f"| {r.import_s:.1f} | {r.build_s:.1f} | {r.call_s:.1f} "
        f"| {'' if r.compiled_s is None else f'{r.compiled_s:.1f}'} |"
        for r in records
    )
    print(f"\nfirst results in fresh processes on {records[0].gpu}, torch {records[0].torch}: "
          f"wrote {path}\n\n| model | atoms | impl | compile caches | first result s "
          f"| imports s | build s | first call s | compiled result s |\n"
          f"|---|---:|---|---|---:|---:|---:|---:|---:|\n"
          f"{rows}\n", flush=True)
    return records


def run_throughput(
    names: list[str],
    *,
    device: str,
    passes: int,
    out: Path,
    small: bool = False,
    contenders: list[str] | None = None,
) -> list[ThroughputRecord]:
    """The ``throughput`` workload for models ``names`` (keys of ``MODELS``): write
    ``{out}/throughput.json`` (rewritten after each set) and ``throughput.png``.

    Per model: ``fastcalc`` (the calculator on one structure after another through ASE)
    and ``fastcalc-many`` (its ``evaluate_many``) share one calculator, built once for
    both sets, as in one script; the upstream's batched path (``{upstream}-batched``, in
    runs of at most ``MAX_ATOMS`` atoms, as ``evaluate_many`` batches) is built afresh
    for each set, since fairchem's fallback from its fast path is for good. The same
    three again in TF32: ``fastcalc-tf32`` and ``fastcalc-tf32-many`` (one calculator
    with ``precision="tf32"``) and ``{upstream}-tf32-batched``.
    ``contenders`` times only those of the three (default: all), so that each can have
    the GPU's memory to itself in a process of its own.
    """
    _torch_settings()
    path = out / "throughput.json"
    sets = throughput_sets(small)
    records: list[ThroughputRecord] = []
    for name in names:
        with _contest(name, device, small) as contest:
            first = next(iter(sets.values()))[0]
            agreement = check_agreement(contest.reference(), contest.eager(), first)
            print(f"{contest.model}: eager fastcalc against {contest.upstream} (float32, "
                  f"{len(first)} atoms), relative differences {agreement}", flush=True)
            calculators = contest.contenders()
            fastcalc, tf32 = calculators["fastcalc"], calculators["fastcalc-tf32"]
            evaluators = chosen({
                "fastcalc": lambda: one_at_a_time(fastcalc()),
                "fastcalc-many": lambda: many_at_once(fastcalc()),
                f"{contest.upstream}-batched": lambda: in_chunks(contest.batched()),
                "fastcalc-tf32": lambda: one_at_a_time(tf32()),
                "fastcalc-tf32-many": lambda: many_at_once(tf32()),
                f"{contest.upstream}-tf32-batched": lambda: in_chunks(contest.batched_tf32()),
            }, contenders)
            for structure_set, structures in sets.items():
                records += time_throughput(
                    evaluators, structures, contest.model, structure_set,
                    reference=lambda: one_at_a_time(contest.accurate()), passes=passes,
                    progress=_bar(f"{contest.model}, {structure_set}"),
                )
                write_records(records, path)
    plot_throughput(records, path.with_suffix(".png"))
    print(f"\nthroughput on {records[0].gpu}, torch {records[0].torch}: wrote {path} and "
          f"{path.with_suffix('.png').name}; differences against eager float64 fastcalc\n\n"
          f"{throughput_table(records)}\n", flush=True)
    return records
