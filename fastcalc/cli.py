"""The ``fastcalc`` command line: ``fastcalc md`` runs molecular dynamics with a model,
``fastcalc bench`` times fastcalc against the upstream calculators."""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from ase.io import read

from .bench.suite import MODELS, run_benchmark, run_stream
from .bench.timing import COPPER_REPEATS
from .md import ENSEMBLES, default_structure, run_md
from .models import DEMO_MODELS, load_calculator

__all__ = ["WORKLOADS", "default_out", "main"]

#: What ``fastcalc bench`` times.
WORKLOADS = ("sizes", "stream")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastcalc", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    md = commands.add_parser("md", help="run molecular dynamics with ASE's integrators")
    md.add_argument("structure", nargs="?", help="any file ASE reads (default: 108-atom fcc Cu)")
    md.add_argument("--model", default="pet-demo-cu",
                    help=f"bundled model ({', '.join(DEMO_MODELS)}) or a model file")
    md.add_argument("--task", help="UMA task (dataset head), e.g. omat or omol")
    md.add_argument("--steps", type=int, default=100)
    md.add_argument("--timestep", type=float, default=2.0, help="fs")
    md.add_argument("--temperature", type=float, default=300.0, help="K")
    md.add_argument("--ensemble", choices=ENSEMBLES, default="nve")
    md.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    md.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    md.add_argument("--output", help="ASE trajectory file (.traj) with energies and forces")
    md.add_argument("--log", help="ASE MD log file")
    bench = commands.add_parser(
        "bench", help="time fastcalc against the upstream calculators on random models"
    )
    bench.add_argument("model", nargs="?", choices=(*MODELS, "all"), default="all",
                       help="PET-S- or UMA-S-shaped random model, or both (default)")
    bench.add_argument("--workload", choices=WORKLOADS, default="sizes",
                       help="sizes: fcc copper at each size (default); stream: one calculator "
                            "over a list of different structures")
    bench.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    bench.add_argument("--sizes", type=int, nargs="+", choices=sorted(COPPER_REPEATS),
                       metavar="N", help="atom counts of fcc copper (default: 64 108 1008)")
    bench.add_argument("--calls", type=_at_least(1), metavar="N",
                       help="timed calls per size (default: 20) or per structure of the "
                            "stream (default: 10)")
    bench.add_argument("--warmup", type=_at_least(0), metavar="N",
                       help="warm-up calls per size before timing (default: 3)")
    bench.add_argument("--out", type=Path, metavar="FOLDER",
                       help="where the records (pet.json, uma.json or stream.json) and their "
                            "plots go (default: a new folder ./fastcalc-bench-DATE-TIME)")
    bench.add_argument("--small", action="store_true",
                       help="tiny models, 32 atoms or three small structures, 3 or 2 calls: "
                            "a smoke test")
    return parser


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than ``minimum``."""

    def count(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return count


def _md(args: argparse.Namespace) -> None:
    atoms = read(args.structure) if args.structure else default_structure()
    calculator = load_calculator(args.model, task=args.task, device=args.device, dtype=args.dtype)
    print(f"{len(atoms)} atoms, model {args.model} on {calculator.device} ({args.dtype}), "
          f"{args.ensemble} at {args.temperature:g} K, {args.timestep:g} fs steps")
    summary = run_md(
        atoms, calculator, steps=args.steps, timestep_fs=args.timestep,
        temperature_K=args.temperature, ensemble=args.ensemble, trajectory=args.output,
        log=args.log,
    )
    print(summary)


def default_out(now: datetime.datetime) -> Path:
    """A new folder for the records, named by the time: never the committed records."""
    return Path(f"fastcalc-bench-{now:%Y-%m-%d-%H%M%S}")


def _bench(args: argparse.Namespace) -> None:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = args.out or default_out(datetime.datetime.now())
    print(f"fastcalc bench: writing into {out}", flush=True)
    names = list(MODELS) if args.model == "all" else [args.model]
    if args.workload == "stream":
        calls = args.calls if args.calls is not None else (2 if args.small else 10)
        run_stream(names, device=device, calls=calls, out=out, small=args.small)
        return
    sizes = args.sizes or ([32] if args.small else [64, 108, 1008])
    calls = args.calls if args.calls is not None else (3 if args.small else 20)
    warmup = args.warmup if args.warmup is not None else (2 if args.small else 3)
    for name in names:
        run_benchmark(name, device=device, sizes=sizes, calls=calls, warmup=warmup,
                      out=out, small=args.small)


def main(argv: list[str] | None = None) -> None:
    """Run ``fastcalc md`` or ``fastcalc bench`` with ``argv`` (default: the command line)."""
    args = _parser().parse_args(argv)
    if args.command == "md":
        _md(args)
    elif args.command == "bench":
        _bench(args)


if __name__ == "__main__":
    sys.exit(main())
