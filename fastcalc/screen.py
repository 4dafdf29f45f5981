"""Screening many structures: evaluate or relax each with a model, keeping every result.

:func:`screen` takes structures one at a time, hands each to :func:`screen_structure`
(in this process, or on Ray actors that each hold one calculator; a calculator that
evaluates batches takes many structures per model call instead, in runs of
:data:`SCREEN_BATCH_ATOMS` atoms: through ``evaluate_many``, and for relaxations through
:func:`fastcalc.relax.irelax`, step for step the same FIRE) and appends each
result to an extended XYZ file as soon as it finishes, flushed, tagged with its input index
(``info["screen_index"]``) and with what made it (``info["screen_relax"]``, ...). A run
that is killed keeps what it wrote, and ``resume=True`` does only the indices the file
lacks, with the same settings. A structure the model cannot evaluate is written with its
error (``info["screen_error"]``) and the run goes on.
"""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from contextlib import ExitStack, closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from ase import Atoms
from ase.calculators.calculator import Calculator
from ase.calculators.singlepoint import SinglePointCalculator
from ase.io import iread, write
from ase.optimize import FIRE

from .calculator import InvalidAtomsError, atom_chunks
from .progress import progress_bar
from .relax import Relaxed, irelax

__all__ = [
    "OUTPUT_SUFFIXES",
    "QUEUED_PER_WORKER",
    "SCREEN_BATCH_ATOMS",
    "STRUCTURE_ERRORS",
    "ScreenSetupError",
    "ScreenSummary",
    "WorkerDiedError",
    "check_screen",
    "screen",
    "screen_structure",
]

#: Output suffixes :func:`screen` writes, both extended XYZ: a format that takes one
#: frame after another and that ASE reads back with energies, forces and stress.
OUTPUT_SUFFIXES = (".extxyz", ".xyz")

#: Exceptions that mean one structure cannot be evaluated (NaN positions, an element the
#: model lacks, a degenerate cell, ...): recorded as that structure's error. Anything else
#: stops the run, since it would most likely fail every structure the same way.
STRUCTURE_ERRORS: tuple[type[Exception], ...] = (InvalidAtomsError,)

#: Runs of structures queued on each Ray actor: one running and one waiting, so that an
#: actor never idles while the driver writes results and sends the next run.
QUEUED_PER_WORKER = 2

#: Atoms per ``evaluate_many`` call (and per run sent to a Ray actor) when a screen's
#: calculator evaluates structures in batches: results are written when their batch
#: finishes.
SCREEN_BATCH_ATOMS = 2048

#: ``info`` and ``arrays`` keys of an input structure that would clash with the results
#: in extended XYZ (ASE's writer refuses both).
_RESULT_KEYS = ("energy", "free_energy", "stress", "forces")


class ScreenSetupError(ValueError):
    """A screen that cannot start: an output that is not extended XYZ, that exists without
    ``resume`` or that other settings wrote, a tolerance or step count that cannot be met,
    workers without Ray or beyond the cluster's CPUs or GPUs."""


class WorkerDiedError(RuntimeError):
    """A Ray worker died (killed, out of memory, crashed) with structures in hand: raised
    once the other workers have done all they could, naming the structures lost, which a
    resume does."""


@dataclass(frozen=True)
class ScreenSummary:
    """What a screen did: structures evaluated (``done``), recorded with an error
    (``failed``), skipped because the output held them already (``skipped``), and the
    seconds it took."""

    done: int
    failed: int
    skipped: int
    seconds: float

    @property
    def per_second(self) -> float:
        """Structures done or failed per second of the whole run, model loading included."""
        return (self.done + self.failed) / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        return (f"{self.done} done, {self.failed} failed, {self.skipped} skipped (already in "
                f"the output) in {self.seconds:.1f} s: {self.per_second:.2f} structures/s")


def screen_structure(
    calculator: Calculator,
    atoms: Atoms,
    *,
    relax: bool = False,
    fmax: float = 0.05,
    max_steps: int = 500,
) -> Atoms:
    """A copy of ``atoms`` with its energy, forces and (periodic along all three axes)
    stress from ``calculator`` on a :class:`~ase.calculators.singlepoint.SinglePointCalculator`.

    With ``relax``, the positions (not the cell) are first relaxed with ASE's FIRE until
    the largest force is below ``fmax`` eV/Å or ``max_steps`` steps have run; the copy holds
    the relaxed positions, ``info["screen_steps"]`` and ``info["screen_converged"]``. If
    ``atoms`` cannot be evaluated (:data:`STRUCTURE_ERRORS`), the copy has no results and
    ``info["screen_error"]`` holds the message in one line. Input ``info`` and ``arrays``
    entries named like a result (``energy``, ``forces``, ...) are dropped from a result,
    which replaces them.
    """
    result = atoms.copy()
    result.calc = calculator
    try:
        if relax:
            optimizer = FIRE(result, logfile=None)
            converged = optimizer.run(fmax=fmax, steps=max_steps)
            result.info.update(screen_steps=optimizer.nsteps, screen_converged=bool(converged))
        properties = {"energy": result.get_potential_energy(), "forces": result.get_forces()}
        if result.pbc.all():
            properties["stress"] = result.get_stress()
    except STRUCTURE_ERRORS as error:
        return _failed(atoms.copy(), error)
    return _with_results(result, properties)


def _failed(atoms: Atoms, error: Exception) -> Atoms:
    """``atoms`` with the message of ``error`` in one line as ``info["screen_error"]``."""
    atoms.info["screen_error"] = " ".join(str(error).split())
    return atoms


def _with_results(atoms: Atoms, properties: dict[str, Any]) -> Atoms:
    """``atoms`` holding ``properties`` on a SinglePointCalculator, its ``info`` and
    ``arrays`` entries named like a result dropped."""
    for key in _RESULT_KEYS:
        atoms.info.pop(key, None)
        atoms.arrays.pop(key, None)
    atoms.calc = SinglePointCalculator(atoms, **properties)
    return atoms


def _relaxed_result(relaxed: Relaxed) -> Atoms:
    """What :func:`screen_structure` gives with ``relax``, from a batched relaxation; a
    structure that fails after some steps is written where it failed."""
    if relaxed.error is not None:
        return _failed(relaxed.atoms, relaxed.error)
    properties = {"energy": relaxed.energy, "forces": relaxed.forces}
    if relaxed.atoms.pbc.all():
        properties["stress"] = relaxed.stress
    result = _with_results(relaxed.atoms, properties)
    result.info.update(screen_steps=relaxed.steps, screen_converged=relaxed.converged)
    return result


def _ray() -> ModuleType:
    """The ``ray`` module; :class:`ScreenSetupError` saying how to install it otherwise."""
    try:
        import ray
    except ImportError as error:
        raise ScreenSetupError(
            "workers run on Ray, which is not installed here: pip install 'fastcalc[ray]'"
        ) from error
    return ray


def check_screen(
    out: str | Path,
    *,
    fmax: float = 0.05,
    max_steps: int = 500,
    workers: int | None = None,
    resume: bool = False,
) -> None:
    """Raise :class:`ScreenSetupError` naming what keeps this screen from starting; cheap
    (it loads no model), so that a command line can check before it loads one."""
    out = Path(out)
    if out.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ScreenSetupError(f"cannot write screening results to {str(out)!r}: use "
                               f"{' or '.join(OUTPUT_SUFFIXES)} (extended XYZ)")
    if not out.parent.is_dir():
        raise ScreenSetupError(f"no folder {str(out.parent)!r} for the output {str(out)!r}")
    if not resume and out.is_file() and out.stat().st_size > 0:
        raise ScreenSetupError(f"{str(out)!r} already exists: resume to do only the "
                               f"structures it lacks, or write elsewhere")
    if not fmax > 0:
        raise ScreenSetupError(f"fmax must be positive, got {fmax:g} eV/A")
    if max_steps < 1:
        raise ScreenSetupError(f"max_steps must be at least 1, got {max_steps}")
    if workers is not None:
        if workers < 1:
            raise ScreenSetupError(f"workers must be at least 1, got {workers}")
        _ray()


def _complete_bytes(path: Path) -> int:
    """The length of the complete extended XYZ frames at the start of ``path``: a run killed
    while it wrote a frame leaves part of one at the end."""
    complete = 0
    with open(path, "rb") as handle:
        while header := handle.readline():
            if not header.endswith(b"\n"):
                break
            try:
                natoms = int(header)
            except ValueError:
                raise ScreenSetupError(
                    f"{str(path)!r} is not extended XYZ as fastcalc screen writes it: byte "
                    f"{complete} should start a frame with its atom count"
                ) from None
            lines = [handle.readline() for _ in range(natoms + 1)]
            if not all(line.endswith(b"\n") for line in lines):
                break
            complete = handle.tell()
    return complete


Setting = str | int | float | bool


def _recorded(
    relax: bool, fmax: float, max_steps: int, settings: Mapping[str, Setting | None]
) -> dict[str, Setting]:
    """The ``info`` entries that say what made a screen's results: ``settings`` (those not
    None) and the relaxation's, each as ``screen_<name>``."""
    made_by = {**settings, "relax": relax}
    if relax:
        made_by.update(fmax=fmax, max_steps=max_steps)
    return {f"screen_{name}": value for name, value in made_by.items() if value is not None}


def _other_settings(info: dict[str, Any], recorded: dict[str, Setting]) -> list[str]:
    """``"name OLD in the file, NEW now"`` for each of ``recorded`` that ``info`` holds
    with another value or lacks (compared as text, as extended XYZ writes them)."""
    return [
        f"{key.removeprefix('screen_')} {info.get(key)!s} in the file, {value!s} now"
        for key, value in recorded.items()
        if str(info.get(key)) != str(value)
    ]


def _indices_done(out: Path, recorded: dict[str, Setting]) -> set[int]:
    """The ``screen_index`` of every complete frame in ``out``; a part of a frame at its
    end is cut off (with a warning) so that new frames follow complete ones. A frame made
    with settings other than ``recorded`` raises :class:`ScreenSetupError`: its results
    and this run's would not be one screen."""
    complete = _complete_bytes(out)
    if complete < out.stat().st_size:
        warnings.warn(f"{str(out)!r} ends in an incomplete frame (the run was killed while "
                      f"writing it); it is dropped and its structure done again", stacklevel=3)
        with open(out, "r+b") as handle:
            handle.truncate(complete)
    done = set()
    for number, atoms in enumerate(iread(out, format="extxyz")):
        if "screen_index" not in atoms.info:
            raise ScreenSetupError(f"frame {number} of {str(out)!r} has no screen_index: it "
                                   f"is not the output of a screen")
        if changed := _other_settings(atoms.info, recorded):
            raise ScreenSetupError(
                f"frame {number} of {str(out)!r} was made with other settings "
                f"({'; '.join(changed)}): resume with the settings that made it, or write "
                f"elsewhere"
            )
        done.add(int(atoms.info["screen_index"]))
    return done


Work = Callable[[Calculator, Atoms], Atoms]


def _serial(
    todo: Iterator[tuple[int, Atoms]],
    calculator_factory: Callable[[], Calculator],
    work: Work,
    relax: tuple[float, int] | None = None,
) -> Iterator[Atoms]:
    """Results of ``todo`` with one calculator, built in this process (see
    :func:`_results`)."""
    yield from _results(todo, calculator_factory(), work, relax)


def _batches(calculator: Calculator) -> bool:
    """Whether ``calculator`` evaluates structures in batches (UMA's, PET's)."""
    return getattr(calculator, "evaluates_batches", False)


def _results(
    todo: Iterator[tuple[int, Atoms]],
    calculator: Calculator,
    work: Work,
    relax: tuple[float, int] | None = None,
) -> Iterator[Atoms]:
    """Results of ``todo`` with ``calculator``, in input order. A calculator that
    evaluates batches evaluates runs of :data:`SCREEN_BATCH_ATOMS` atoms per
    ``evaluate_many`` call and, given ``relax`` (fmax, max_steps), relaxes in batches
    (:func:`fastcalc.relax.irelax`), results in the order they finish. Others go one at
    a time: their ``evaluate_many`` would loop anyway, and alternating structures would
    redo the neighbour search at every step."""
    if relax is not None and _batches(calculator):
        indices = []

        def structures() -> Iterator[Atoms]:
            for index, atoms in todo:
                indices.append(index)
                yield atoms

        fmax, max_steps = relax
        for position, relaxed in irelax(structures(), calculator, fmax=fmax,
                                        max_steps=max_steps):
            result = _relaxed_result(relaxed)
            result.info["screen_index"] = indices[position]
            yield result
        return
    if relax is None and _batches(calculator):
        for batch in atom_chunks(todo, lambda item: len(item[1]), SCREEN_BATCH_ATOMS):
            entries = calculator.evaluate_many([atoms for _, atoms in batch])
            for (index, atoms), entry in zip(batch, entries):
                result = _evaluated_result(atoms, entry)
                result.info["screen_index"] = index
                yield result
        return
    for index, atoms in todo:
        result = work(calculator, atoms)
        result.info["screen_index"] = index
        yield result


def _evaluated_result(atoms: Atoms, entry: dict[str, Any]) -> Atoms:
    """What :func:`screen_structure` gives without ``relax``, from an ``evaluate_many``
    entry."""
    if "error" in entry:
        return _failed(atoms.copy(), entry["error"])
    properties = {"energy": entry["energy"], "forces": entry["forces"]}
    if atoms.pbc.all():
        properties["stress"] = entry["stress"]
    return _with_results(atoms.copy(), properties)


class _Worker:
    """A Ray actor's state: one calculator, built once, and the work done with it."""

    def __init__(
        self,
        calculator_factory: Callable[[], Calculator],
        work: Work,
        relax: tuple[float, int] | None,
    ) -> None:
        self.work = work
        self.relax = relax
        self.error: Exception | None = None
        try:
            self.calculator = calculator_factory()
        except Exception as error:  # handed to the driver, which raises it as it is
            self.error = error

    def ready(self) -> tuple[Exception | None, bool]:
        """(None, whether the calculator evaluates batches) once it is built, else (the
        exception that building it raised, False)."""
        return self.error, self.error is None and _batches(self.calculator)

    def run(self, items: list[tuple[int, Atoms]]) -> list[Atoms]:
        """The results of ``items`` (input index, structure), as :func:`_results` gives
        them."""
        return list(_results(iter(items), self.calculator, self.work, self.relax))


def _on_ray(
    todo: Iterator[tuple[int, Atoms]],
    calculator_factory: Callable[[], Calculator],
    work: Work,
    workers: int,
    gpus_per_worker: float,
    relax: tuple[float, int] | None = None,
) -> Iterator[Atoms]:
    """Results of ``todo`` from ``workers`` Ray actors, each with its own calculator (and
    ``gpus_per_worker`` GPUs), in the order they finish. Each actor is sent runs of
    structures: of :data:`SCREEN_BATCH_ATOMS` atoms for a calculator that evaluates
    batches, which it evaluates (or, given ``relax``, relaxes) as :func:`_results` does,
    else of one structure. Uses the running Ray cluster, or starts a local one for the
    run. A worker that dies loses the structures it holds; the others go on, and
    :class:`WorkerDiedError` names the lost ones at the end."""
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        ray.init()
    actors: list[Any] = []
    try:
        resources = ray.cluster_resources()
        for kind, each in (("CPU", 1), ("GPU", gpus_per_worker)):
            if workers * each > resources.get(kind, 0):
                raise ScreenSetupError(
                    f"{workers} workers need {workers * each:g} {kind}s (one worker uses "
                    f"{each:g}); the Ray cluster has {resources.get(kind, 0):g}"
                )
        actor_class = ray.remote(_Worker).options(num_cpus=1, num_gpus=gpus_per_worker)
        actors = [actor_class.remote(calculator_factory, work, relax) for _ in range(workers)]
        states = ray.get([actor.ready.remote() for actor in actors])
        for error, _ in states:
            if error is not None:
                raise error
        run_atoms = SCREEN_BATCH_ATOMS if states[0][1] else 0  # 0: one structure per run
        runs = atom_chunks(todo, lambda item: len(item[1]), run_atoms)
        running: dict[Any, tuple[Any, list[int]]] = {}  # result reference: (actor, indices)

        def feed(actor: Any) -> None:
            run = next(runs, None)
            if run is not None:
                running[actor.run.remote(run)] = (actor, [index for index, _ in run])

        for _ in range(QUEUED_PER_WORKER):  # round by round: a short screen reaches all
            for actor in actors:
                feed(actor)
        dead: set[int] = set()  # id() of the dead actors, whose handles stay in ``actors``
        lost: list[int] = []
        while running:
            [finished], _ = ray.wait(list(running), num_returns=1)
            actor, indices = running.pop(finished)
            try:
                results = ray.get(finished)
            except ray.exceptions.RayActorError:
                dead.add(id(actor))
                lost += indices
                continue
            if id(actor) not in dead:
                feed(actor)  # before the driver writes, so that the actor keeps working
            yield from results
        if lost:
            numbers = ", ".join(map(str, sorted(lost)))
            raise WorkerDiedError(
                f"{len(dead)} of {workers} Ray workers died, losing structures {numbers} "
                f"(Ray's log says why)"
            )
    finally:
        for actor in actors:
            ray.kill(actor)
        if started:
            ray.shutdown()


def _append(handle: TextIO, atoms: Atoms) -> None:
    """Append ``atoms`` to ``handle`` as one extended XYZ frame, in one write, flushed."""
    text = io.StringIO()
    write(text, atoms, format="extxyz")
    handle.write(text.getvalue())
    handle.flush()


def screen(
    structures: Iterable[Atoms],
    calculator_factory: Callable[[], Calculator],
    out: str | Path,
    *,
    relax: bool = False,
    fmax: float = 0.05,
    max_steps: int = 500,
    workers: int | None = None,
    gpus_per_worker: float = 0.0,
    resume: bool = False,
    progress: bool = True,
    settings: Mapping[str, Setting | None] | None = None,
) -> ScreenSummary:
    """Evaluate (or, with ``relax``, relax) every structure with :func:`screen_structure`,
    appending each result to the extended XYZ file ``out`` as it finishes.

    Each frame carries its position in ``structures`` as ``info["screen_index"]``; results
    of several workers come in the order they finish. A calculator that evaluates batches
    (``evaluates_batches``: UMA, PET) evaluates runs of :data:`SCREEN_BATCH_ATOMS` atoms
    per model call, and relaxes them many at once (:func:`fastcalc.relax.irelax`, the same
    FIRE), their results in the order they finish too; each worker takes such runs.
    ``calculator_factory()`` builds a calculator: once in this process (``workers=None``),
    or once in each of ``workers`` Ray actors (each with one CPU and ``gpus_per_worker``
    GPUs; the factory must pickle). Each frame records ``relax`` (and with it ``fmax`` and
    ``max_steps``) and ``settings`` (what else made the results, such as the model and its
    dtype; None values are left out) as ``info["screen_<name>"]``. An existing ``out`` is
    refused unless ``resume``, which skips the indices it holds, and refused then too if a
    frame records other settings. A
    progress bar shows structures per second unless ``progress`` is False. Raises
    :class:`ScreenSetupError` before any model loads if the screen cannot start
    (:func:`check_screen`), and :class:`WorkerDiedError` at the end if a worker died.
    """
    out = Path(out)
    check_screen(out, fmax=fmax, max_steps=max_steps, workers=workers, resume=resume)
    recorded = _recorded(relax, fmax, max_steps, settings or {})
    done = _indices_done(out, recorded) if resume and out.is_file() else set()
    skipped = 0

    def todo() -> Iterator[tuple[int, Atoms]]:
        nonlocal skipped
        for index, atoms in enumerate(structures):
            if index in done:
                skipped += 1
            else:
                yield index, atoms

    work = partial(screen_structure, relax=relax, fmax=fmax, max_steps=max_steps)
    batched = (fmax, max_steps) if relax else None
    if workers is None:
        results = _serial(todo(), calculator_factory, work, batched)
    else:
        results = _on_ray(todo(), calculator_factory, work, workers, gpus_per_worker, batched)
    total = len(set(range(len(structures))) - done) if isinstance(structures, Sized) else None
    counts = {"done": 0, "failed": 0}
    start = time.perf_counter()
    with ExitStack() as stack:
        stack.enter_context(closing(results))
        bar = stack.enter_context(
            progress_bar(total=total, unit="structure", disable=not progress, dynamic_ncols=True)
        )
        handle = None  # opened at the first result: a run that fails to start writes nothing
        for result in results:
            if handle is None:
                handle = stack.enter_context(open(out, "a"))
            result.info.update(recorded)
            _append(handle, result)
            counts["failed" if "screen_error" in result.info else "done"] += 1
            bar.set_postfix(counts, refresh=False)
            bar.update(1)
    return ScreenSummary(**counts, skipped=skipped, seconds=time.perf_counter() - start)
