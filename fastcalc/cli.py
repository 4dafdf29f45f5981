"""The ``fastcalc`` command line: ``fastcalc md`` runs molecular dynamics with a model,
``fastcalc screen`` evaluates or relaxes every structure of a file, ``fastcalc bench``
times fastcalc against the upstream calculators, ``fastcalc compile`` fills the disk
cache of compiled models ahead of time and ``fastcalc cache`` lists or clears it.

A mistake in what the user asked for (a missing file, a misspelt model, an element the
model lacks, an impossible run) is one line on stderr and exit status 2; ``--debug``
shows its traceback instead. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import NoReturn

import torch
from ase import Atoms
from ase.build import bulk
from ase.data import chemical_symbols, covalent_radii
from ase.io import iread, read
from ase.io.formats import UnknownFileTypeError

from . import __version__
from .bench.suite import (
    MODELS,
    UnknownContenderError,
    run_benchmark,
    run_first_result,
    run_stream,
    run_throughput,
)
from .bench.timing import COPPER_REPEATS
from .calculator import InvalidAtomsError, TorchCalculator, why_no_cuda
from .compile_cache import CONVERTED, CompileCache
from .precision import PRECISIONS
from .md import (
    ENSEMBLES,
    NPT_PRESSURE_GPA,
    TRAJECTORY_FORMATS,
    MDSetupError,
    check_run,
    default_structure,
    run_md,
)
from .models import DEMO_MODELS, load_calculator, resolve_model_path
from .registry import TaskNotSupportedError, UnknownModelError
from .screen import ScreenSetupError, WorkerDiedError, check_screen, screen
from .uma import NotUMACheckpointError, UnknownTaskError

__all__ = ["USER_ERRORS", "WORKLOADS", "UsageError", "default_out", "main"]

#: What each ``--precision`` means (see :mod:`fastcalc.precision`).
PRECISION_HELP = ("float32: IEEE float32 throughout; tf32: the network's matrix products on "
                  "TF32 tensor cores (CUDA, errors near 1e-2 of the largest force); 3xtf32: "
                  "its linear maps as three TF32 products each (CUDA, float32's accuracy)")
#: What ``fastcalc bench`` times.
WORKLOADS = ("sizes", "stream", "first-result", "throughput")
#: Where ``compile`` and ``cache`` find the disk cache (:mod:`fastcalc.compile_cache`).
_CACHE_DIR_HELP = ("the cache folder (default: $FASTCALC_CACHE_DIR, else "
                   "$XDG_CACHE_HOME/fastcalc, else ~/.cache/fastcalc)")


class UsageError(Exception):
    """A mistake in how the command was called that the command itself found."""


#: Exceptions that mean the user asked for something impossible, not that fastcalc has a
#: bug: ``main`` reports them in one line with exit status 2.
USER_ERRORS: tuple[type[Exception], ...] = (
    UsageError,
    InvalidAtomsError,
    MDSetupError,
    NotUMACheckpointError,
    ScreenSetupError,
    TaskNotSupportedError,
    UnknownContenderError,
    UnknownModelError,
    UnknownTaskError,
)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (argparse's print the usage too)."""

    def error(self, message: str) -> NoReturn:
        """Report ``message`` in one line, pointing at ``--help``, and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults in ``--help``, except unset ones (``None``) and flags' ``False``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _version() -> str:
    """The installed distribution's version, or the package's own when it is not installed."""
    try:
        return metadata.version("fastcalc")
    except metadata.PackageNotFoundError:
        return __version__


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fastcalc", formatter_class=_HelpFormatter,
        description="fastcalc md runs molecular dynamics with a model; fastcalc screen "
                    "evaluates or relaxes every structure of a file; fastcalc bench times "
                    "fastcalc against the upstream calculators; fastcalc compile and "
                    "fastcalc cache manage the disk cache of compiled models. A user's "
                    "mistake is one line and exit status 2 (--debug shows its traceback).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    common = _Parser(add_help=False)
    common.add_argument("--device", choices=("cpu", "cuda"),
                        help="where the model runs (default: cuda when available)")
    common.add_argument("--threads", type=_at_least(1), metavar="N",
                        help="CPU threads for torch (default: torch's choice)")
    common.add_argument("--debug", action="store_true",
                        help="show the traceback of a user error instead of one line")
    numerics = _Parser(add_help=False)  # of the commands that build a calculator
    numerics.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                          help="the model's floating-point precision")
    numerics.add_argument("--precision", choices=PRECISIONS, default="float32",
                          help=PRECISION_HELP)
    commands = parser.add_subparsers(dest="command", required=True)
    md = commands.add_parser("md", help="run molecular dynamics with ASE's integrators",
                             parents=[common, numerics], formatter_class=_HelpFormatter)
    md.add_argument("structure", nargs="?",
                    help="any file ASE reads (default: 108-atom fcc Cu, 32 with --small)")
    md.add_argument("--model", default="pet-demo-cu",
                    help=f"bundled model ({', '.join(DEMO_MODELS)}) or a model file")
    md.add_argument("--task", help="UMA task (dataset head), e.g. omat or omol")
    md.add_argument("--steps", type=int, help="MD steps (default: 100, or 20 with --small)")
    md.add_argument("--timestep", type=float, default=2.0, help="MD timestep in fs")
    md.add_argument("--temperature", type=float, default=300.0,
                    help="temperature in K of the starting velocities and of the thermostat")
    md.add_argument("--ensemble", choices=ENSEMBLES, default="nve",
                    help="nve: velocity Verlet; langevin; nvt: Nose-Hoover chain; "
                         f"npt: isotropic MTK at {NPT_PRESSURE_GPA:g} GPa")
    md.add_argument("--output", metavar="FILE",
                    help="trajectory with energies and forces, every 10th step: "
                         f"{', '.join(TRAJECTORY_FORMATS)} (.xyz is extended XYZ)")
    md.add_argument("--log", metavar="FILE", help="ASE MD log file")
    md.add_argument("--small", action="store_true",
                    help="32 atoms of fcc Cu and 20 steps unless given: a quick smoke test")
    screening = commands.add_parser(
        "screen", help="evaluate or relax every structure of a file, appending each result "
                       "to an extended XYZ file as it finishes",
        parents=[common, numerics], formatter_class=_HelpFormatter,
    )
    screening.add_argument("input", metavar="INPUT",
                           help="any file ASE reads, with one or more structures")
    screening.add_argument("--model", default="pet-demo-cu",
                           help=f"bundled model ({', '.join(DEMO_MODELS)}) or a model file")
    screening.add_argument("--task", help="UMA task (dataset head), e.g. omat or omol")
    screening.add_argument("--relax", action="store_true",
                           help="relax the positions with FIRE (ASE's, step for step; many "
                                "structures per model call for models that batch) first")
    screening.add_argument("--fmax", type=float, default=0.05,
                           help="--relax stops when the largest force is below this, in eV/A")
    screening.add_argument("--max-steps", type=_at_least(1), default=500,
                           help="--relax stops after this many FIRE steps")
    screening.add_argument("--out", metavar="FILE",
                           help="extended XYZ results (.extxyz or .xyz) (default: "
                                "INPUT's name with -screen.extxyz, in this folder)")
    screening.add_argument("--workers", type=_at_least(1), metavar="N",
                           help="run on N Ray actors, each with its own calculator (one GPU "
                                "each with --device cuda, else one CPU core); needs "
                                "fastcalc[ray] (default: one calculator in this process)")
    screening.add_argument("--resume", action="store_true",
                           help="continue an existing --out: skip the structures it holds")
    bench = commands.add_parser(
        "bench", help="time fastcalc against the upstream calculators on random models",
        parents=[common], formatter_class=_HelpFormatter,
    )
    bench.add_argument("model", nargs="?", choices=(*MODELS, "all"), default="all",
                       help="PET-S- or UMA-S-shaped random model, or both")
    bench.add_argument("--workload", choices=WORKLOADS, default="sizes",
                       help="sizes: fcc copper at each size; stream: one calculator "
                            "over a list of different structures; first-result: fresh "
                            "processes to their first result, compile caches cold and warm; "
                            "throughput: structures per second over two sets, one at a "
                            "time and batched")
    bench.add_argument("--sizes", type=int, nargs="+", choices=sorted(COPPER_REPEATS),
                       metavar="N", help="atom counts of fcc copper (default: 64 108 1008)")
    bench.add_argument("--calls", type=_at_least(1), metavar="N",
                       help="timed calls per size (default: 20), per structure of the "
                            "stream (default: 10) or timed passes over each throughput set "
                            "(default: 3)")
    bench.add_argument("--warmup", type=_at_least(0), metavar="N",
                       help="warm-up calls per size before timing (default: 3)")
    bench.add_argument("--contenders", nargs="+", metavar="NAME",
                       help="sizes, first-result and throughput: time only these "
                            "implementations of the contest, e.g. fairchem fastcalc, or "
                            "fairchem-batched (default: all)")
    bench.add_argument("--out", type=Path, metavar="FOLDER",
                       help="where the records (pet.json, uma.json, stream.json, ...) and their "
                            "plots go (default: a new folder ./fastcalc-bench-DATE-TIME)")
    bench.add_argument("--small", action="store_true",
                       help="tiny models, 32 atoms or a few small structures, fewer calls: "
                            "a smoke test")
    compile_ = commands.add_parser(
        "compile", parents=[common, numerics], formatter_class=_HelpFormatter,
        help="compile a model into the disk cache, so that later processes start faster",
        description="Compile MODEL once (one compilation serves every system size) and "
                    "store it in the disk cache of compiled models, for example once per "
                    "node before a job array. CUDA graphs are recorded by each process.",
    )
    compile_.add_argument("model", help=f"bundled model ({', '.join(DEMO_MODELS)}) or a model file")
    compile_.add_argument("--task", help="UMA task (dataset head), e.g. omat or omol")
    compile_.add_argument("--batched", action="store_true",
                          help="also compile the function that evaluates batches of "
                               "structures (evaluate_many, relax_many, fastcalc screen): "
                               "a second compilation")
    compile_.add_argument("--cache-dir", type=Path, metavar="FOLDER", help=_CACHE_DIR_HELP)
    cache = commands.add_parser(
        "cache", formatter_class=_HelpFormatter,
        help="list or clear the disk cache of compiled models",
    )
    cache.add_argument("action", choices=("list", "clear"))
    cache.add_argument("--cache-dir", type=Path, metavar="FOLDER", help=_CACHE_DIR_HELP)
    cache.set_defaults(debug=False, threads=None)
    return parser


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than ``minimum``."""

    def count(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return count


def _device(requested: str | None) -> str:
    """The device to run on: ``requested``, or CUDA when available; CUDA must be there."""
    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and (why := why_no_cuda()) is not None:
        raise UsageError(f"--device cuda: CUDA is not available here ({why}); use --device cpu")
    return requested


def _structure(path: str | None, small: bool) -> Atoms:
    """The atoms in the file at ``path`` (its last frame, as ``ase.io.read`` gives: where a
    trajectory ended), or the default fcc copper."""
    if path is None:
        return default_structure(2 if small else 3)
    if not Path(path).is_file():
        raise UsageError(f"no structure file {path!r}")
    try:
        atoms = read(path)
    except (OSError, UnknownFileTypeError, ValueError) as error:
        raise UsageError(f"cannot read a structure from {path!r}: {error}") from error
    if len(atoms) == 0:
        raise UsageError(f"the structure in {path!r} has no atoms")
    return atoms


def _model_path(model: str) -> Path:
    """The file of a bundled model name or a model path, which must exist."""
    try:
        return resolve_model_path(model)
    except (FileNotFoundError, IsADirectoryError) as error:
        raise UsageError(str(error)) from error


def _md(args: argparse.Namespace) -> None:
    # the mistakes that can be found without the model, before it loads
    atoms = _structure(args.structure, args.small)
    for option, path in (("--output", args.output), ("--log", args.log)):
        if args.structure and path and Path(path).resolve() == Path(args.structure).resolve():
            raise UsageError(f"{option} {path!r} is the input structure; write it elsewhere")
    steps = args.steps if args.steps is not None else (20 if args.small else 100)
    check_run(atoms, steps=steps, timestep_fs=args.timestep, temperature_K=args.temperature,
              ensemble=args.ensemble, trajectory=args.output, log=args.log)
    device = _device(args.device)
    path = _model_path(args.model)
    calculator = load_calculator(path, task=args.task, device=device, dtype=args.dtype,
                                 precision=args.precision)
    print(f"{len(atoms)} atoms, model {args.model} on {calculator.device} ({args.dtype}, "
          f"precision {args.precision}), "
          f"{args.ensemble} at {args.temperature:g} K, {args.timestep:g} fs steps")
    summary = run_md(
        atoms, calculator, steps=steps, timestep_fs=args.timestep,
        temperature_K=args.temperature, ensemble=args.ensemble, trajectory=args.output,
        log=args.log,
    )
    print(summary)


def _frames(path: str) -> Iterator[Atoms]:
    """The structures in the file at ``path``, read one at a time; the first is read now,
    so that an unreadable file is reported before a model loads."""
    if not Path(path).is_file():
        raise UsageError(f"no structure file {path!r}")
    frames = iread(path)
    read_so_far = 0

    def following() -> Iterator[Atoms]:
        nonlocal read_so_far
        while True:
            try:
                atoms = next(frames)
            except StopIteration:
                return
            except (OSError, UnknownFileTypeError, ValueError) as error:
                raise UsageError(
                    f"cannot read structure {read_so_far} from {path!r}: {error}"
                ) from error
            read_so_far += 1
            yield atoms

    structures = following()
    first = next(structures, None)
    if first is None:
        raise UsageError(f"no structures in {path!r}")
    return itertools.chain([first], structures)


def _screen(args: argparse.Namespace) -> None:
    out = Path(args.out or f"{Path(args.input).stem}-screen.extxyz")
    if out.resolve() == Path(args.input).resolve():
        raise UsageError(f"--out {str(out)!r} is the input file; write the results elsewhere")
    check_screen(out, fmax=args.fmax, max_steps=args.max_steps, workers=args.workers,
                 resume=args.resume)
    structures = _frames(args.input)
    device = _device(args.device)
    path = _model_path(args.model)
    factory = partial(load_calculator, path, task=args.task, device=device,
                      dtype=args.dtype, precision=args.precision)
    # a bundled model by its name, a file by its full path: the same wherever a resume runs
    model = args.model if args.model in DEMO_MODELS else str(path.resolve())
    where = f"{args.workers} Ray workers" if args.workers else "one process"
    what = (f"relaxing (FIRE to fmax {args.fmax:g} eV/A within {args.max_steps} steps)"
            if args.relax else "evaluating")
    print(f"{what} the structures of {args.input} with {args.model} on {device} "
          f"({args.dtype}, precision {args.precision}, {where}) into {out}", flush=True)
    try:
        summary = screen(
            structures, factory, out, relax=args.relax, fmax=args.fmax,
            max_steps=args.max_steps, workers=args.workers,
            gpus_per_worker=1 if device == "cuda" else 0, resume=args.resume,
            settings={"model": model, "task": args.task, "dtype": args.dtype,
                      "precision": args.precision},
        )
    except (KeyboardInterrupt, WorkerDiedError) as error:
        interrupted = isinstance(error, KeyboardInterrupt)
        print(f"fastcalc screen: {'interrupted' if interrupted else error}; the results so far "
              f"are in {out}: run the same command with --resume to do the rest",
              file=sys.stderr)
        raise SystemExit(130 if interrupted else 1) from None
    print(summary)


def default_out(now: datetime.datetime) -> Path:
    """A new folder for the records, named by the time: never the committed records."""
    return Path(f"fastcalc-bench-{now:%Y-%m-%d-%H%M%S}")


def _bench(args: argparse.Namespace) -> None:
    device = _device(args.device)
    out = args.out or default_out(datetime.datetime.now())
    print(f"fastcalc bench: writing into {out}", flush=True)
    names = list(MODELS) if args.model == "all" else [args.model]
    if args.workload == "first-result":
        run_first_result(names, device=device, out=out, small=args.small,
                         contenders=args.contenders)
        return
    if args.workload == "throughput":
        passes = args.calls if args.calls is not None else (1 if args.small else 3)
        run_throughput(names, device=device, passes=passes, out=out, small=args.small,
                       contenders=args.contenders)
        return
    if args.workload == "stream":
        calls = args.calls if args.calls is not None else (2 if args.small else 10)
        run_stream(names, device=device, calls=calls, out=out, small=args.small)
        return
    sizes = args.sizes or ([32] if args.small else [64, 108, 1008])
    calls = args.calls if args.calls is not None else (3 if args.small else 20)
    warmup = args.warmup if args.warmup is not None else (2 if args.small else 3)
    for name in names:
        run_benchmark(name, device=device, sizes=sizes, calls=calls, warmup=warmup,
                      out=out, small=args.small, contenders=args.contenders)


def probe_structure(supported: Iterable[int] | None) -> Atoms:
    """32 atoms of fcc of the lightest element a model supports, at nearest-neighbour
    distance twice its covalent radius: something to compile on."""
    number = min(supported) if supported else 29
    a = 2 * 2**0.5 * covalent_radii[number]
    return bulk(chemical_symbols[number], "fcc", a=a, cubic=True).repeat(2)


def _evaluate_many(calculator: TorchCalculator, atoms: Atoms) -> None:
    """``atoms`` through the calculator's batched function; its error, if it has one."""
    (result,) = calculator.evaluate_many([atoms])
    if "error" in result:
        raise result["error"]


def _compile(args: argparse.Namespace) -> None:
    device = _device(args.device)
    path = _model_path(args.model)
    calculator = load_calculator(
        path, task=args.task, device=device, dtype=args.dtype, compiled=True,
        precision=args.precision, cache_dir=args.cache_dir, compile_in_background=False,
    )
    atoms = probe_structure(calculator.supported_numbers)
    atoms.calc = calculator
    functions = {"one structure": (atoms.get_forces, lambda: calculator.compile_stats)}
    if args.batched:
        functions["batches"] = (partial(_evaluate_many, calculator, atoms),
                                lambda: calculator.batch_compile_stats)
    for function, (call, stats) in functions.items():
        start = time.perf_counter()
        call()
        how = "loaded from the cache" if stats()["from_cache"] else "compiled and stored"
        print(f"{args.model} ({args.dtype}, precision {args.precision}, "
              f"{calculator.compile_mode} on {calculator.device}), {function}: {how} in "
              f"{time.perf_counter() - start:.1f} s, in {CompileCache(args.cache_dir).folder}")


def _cache(args: argparse.Namespace) -> None:
    cache = CompileCache(args.cache_dir)
    if args.action == "clear":
        print(f"removed {cache.clear()} files (compiled and converted models, stale temporary "
              f"files) from {cache.folder}")
        return
    entries = cache.entries()
    print(f"{len(entries)} compiled models in {cache.folder}")
    for entry in entries:
        key = entry.key or {}
        when = datetime.datetime.fromtimestamp(entry.modified)
        details = ", ".join(f"{name} {key[name]}" for name in
                            ("graph", "device", "dtype", "precision", "compile_mode", "torch")
                            if name in key)
        model = (f"model {key['model'][:12]}" if key
                 else "unreadable (its model's next load replaces it)")
        print(f"  {entry.path.name}  {model}  {details}  "
              f"{entry.size / 2**20:.1f} MiB  {when:%Y-%m-%d %H:%M}")
    for name in cache.building():
        print(f"  {name}  being compiled by a process now")
    converted = cache.converted()
    size = sum(path.stat().st_size for path in converted) / 2**20
    print(f"{len(converted)} models converted from their files ({size:.1f} MiB) in "
          f"{cache.folder / CONVERTED}")


def main(argv: list[str] | None = None) -> None:
    """Run ``fastcalc md``, ``screen``, ``bench``, ``compile`` or ``cache`` with ``argv``
    (default: the command line).

    A user error (:data:`USER_ERRORS`) ends in one line on stderr and ``SystemExit(2)``,
    or in its traceback with ``--debug``.
    """
    args = _parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        if getattr(args, "precision", "float32") != "float32" and args.dtype != "float32":
            raise UsageError(f"--precision {args.precision} applies to --dtype float32, not "
                             f"{args.dtype}")
        if args.command == "md":
            _md(args)
        elif args.command == "screen":
            _screen(args)
        elif args.command == "bench":
            _bench(args)
        elif args.command == "compile":
            _compile(args)
        elif args.command == "cache":
            _cache(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        message = " ".join(str(error).split())  # one line, whatever the message holds
        print(f"fastcalc {args.command}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
