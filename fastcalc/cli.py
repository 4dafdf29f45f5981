"""The ``fastcalc`` command line: ``fastcalc md`` runs molecular dynamics with a model."""

from __future__ import annotations

import argparse
import sys

from ase.io import read

from .md import ENSEMBLES, default_structure, run_md
from .models import DEMO_MODELS, load_calculator

__all__ = ["main"]


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
    return parser


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


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "md":
        _md(args)


if __name__ == "__main__":
    sys.exit(main())
