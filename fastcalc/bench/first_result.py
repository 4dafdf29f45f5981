"""The ``first-result`` workload: seconds from starting a fresh process to its first
energy, forces and stress, as a user restarting a script or a notebook kernel waits.

Each measurement is a new Python process that imports, builds one calculator and
evaluates one structure (rattled fcc copper). fastcalc runs twice: ``cold`` with empty
compile caches (fastcalc's disk cache and torch's), then ``warm`` with fastcalc's disk
cache as the cold run left it but torch's own caches empty again, as on another node
of a job array that shares the home folder. The upstream calculator runs ``cold`` and
then ``warm`` with torch's caches as its cold run left them (metatomic compiles
nothing; fairchem's preset compiles).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .timing import copper, device_name, today

__all__ = ["FirstResultRecord", "time_first_results"]


@dataclass(frozen=True)
class FirstResultRecord:
    """One fresh process: ``first_result_s`` from its start to its first result."""

    date: str
    gpu: str
    torch: str
    model: str
    impl: str
    cache: str  # "cold" or "warm" (see the module docstring)
    natoms: int
    first_result_s: float


def _environment(folder: Path, torch_caches: str, fastcalc_cache: str) -> dict[str, str]:
    """The process environment with its compile cache folders under ``folder``."""
    return {
        **os.environ,
        "FASTCALC_CACHE_DIR": str(folder / fastcalc_cache),
        "TORCHINDUCTOR_CACHE_DIR": str(folder / torch_caches / "inductor"),
        "TRITON_CACHE_DIR": str(folder / torch_caches / "triton"),
    }


def _one_process(args: list[str], env: dict[str, str]) -> float:
    """Seconds from starting ``python -m fastcalc.bench.first_result ARGS`` to the moment
    it reports its first result; prints what fastcalc logged of its first call."""
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "fastcalc.bench.first_result", *args],
        env=env, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"first-result process {args} failed:\n{done.stderr[-3000:]}")
    for line in done.stderr.splitlines():
        if line.startswith("fastcalc: first compiled call"):
            print(f"{args[0]} {args[1]}: {line}", flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["done_at"] - start


def time_first_results(
    family: str, model: str, path: Path, impls: list[str], device: str, natoms: int,
    folder: Path,
) -> list[FirstResultRecord]:
    """Each of ``impls`` ("fastcalc" or the upstream's name) cold, then warm, each in a
    fresh process on the model file ``path`` of ``family``; cache folders go under
    ``folder``."""
    import torch

    runs = []
    for impl in impls:
        if impl == "fastcalc":  # warm: its disk cache as the cold run left it, torch's empty
            environments = [_environment(folder, "torch-1", "fastcalc"),
                            _environment(folder, "torch-2", "fastcalc")]
        else:  # warm: torch's caches as the cold run left them
            environments = [_environment(folder, "torch-3", "unused")] * 2
        runs += [(impl, "cold", environments[0]), (impl, "warm", environments[1])]
    return [
        FirstResultRecord(
            date=today(), gpu=device_name(), torch=torch.__version__, model=model, impl=impl,
            cache=cache, natoms=natoms,
            first_result_s=_one_process([family, impl, str(path), device, str(natoms)], env),
        )
        for impl, cache, env in runs
    ]


def _first_result(family: str, impl: str, path: str, device: str, natoms: int) -> None:
    """Build the calculator, evaluate energy, forces and stress once, report the time;
    fastcalc's log of where the first call's time went goes to standard error."""
    logging.basicConfig(format="%(message)s")
    logging.getLogger("fastcalc").setLevel(logging.INFO)
    from .upstream import fairchem_preset_calculator, metatomic_calculator

    if impl == "fastcalc":
        from ..models import load_calculator

        calculator = load_calculator(path, task="omat" if family == "uma" else None,
                                     device=device)
    elif impl == "metatomic":
        calculator = metatomic_calculator(Path(path), device)
    else:
        calculator = fairchem_preset_calculator(Path(path), "omat", device)
    atoms = copper(natoms)
    atoms.calc = calculator
    atoms.get_potential_energy()
    atoms.get_forces()
    atoms.get_stress()
    print(json.dumps({"done_at": time.time()}))


if __name__ == "__main__":
    family, impl, path, device, natoms = sys.argv[1:]
    _first_result(family, impl, path, device, int(natoms))
