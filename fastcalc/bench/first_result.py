"""The ``first-result`` workload: seconds from starting a fresh process to its first
energy, forces and stress, as a user restarting a script or a notebook kernel waits.

Each measurement is a new Python process that imports, builds one calculator and
evaluates one structure (rattled fcc copper). fastcalc runs twice: ``cold`` with empty
compile caches (fastcalc's disk cache and torch's), where its calculator answers
uncompiled while another process compiles the model (``compile_in_background``), then
``warm`` with fastcalc's disk cache as the cold run left it but torch's own caches empty
again, as on another node of a job array that shares the home folder, where it answers
uncompiled while it imports the compiler to load the stored model. Each fastcalc process
then waits for its compiled model and evaluates the structure once more, moved a little
(``compiled_s``: the first result of compiled code). The upstream calculator runs
``cold`` and then ``warm`` with torch's caches as its cold run left them (metatomic compiles
nothing; fairchem's preset compiles).

Each record splits the time into ``import_s`` (from the process's start to its imports
done), ``build_s`` (the calculator) and ``call_s`` (reading the structure and the first
energy, forces and stress). Each process is the script ``first_result_process.py``, run
by path: it imports what a user's script imports and not this package.
All processes share one Python bytecode cache (``PYTHONPYCACHEPREFIX``), filled by an
untimed process that imports what they import, as ``pip install`` leaves bytecode behind:
without it, an image that sets ``PYTHONDONTWRITEBYTECODE`` (the H200 image does) or a
read-only environment compiles torch's sources again in every process, about 9 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ase.io

from ..saved_graph import COMPILER_MODULES
from .first_result_process import UPSTREAM_PACKAGES
from .timing import copper, device_name, today

__all__ = ["FirstResultRecord", "time_first_results"]


@dataclass(frozen=True)
class FirstResultRecord:
    """One fresh process: ``first_result_s`` from its start to its first result, and for
    fastcalc ``compiled_s`` to its first result of compiled code (its first calls may run
    uncompiled while the compiled model is built or loaded)."""

    date: str
    gpu: str
    torch: str
    model: str
    impl: str
    cache: str  # "cold" or "warm" (see the module docstring)
    natoms: int
    first_result_s: float
    import_s: float
    build_s: float
    call_s: float
    compiled_s: float | None


#: The script each timed process runs (see the module docstring).
PROCESS = Path(__file__).with_name("first_result_process.py")

def _environment(folder: Path, torch_caches: str, fastcalc_cache: str) -> dict[str, str]:
    """The process environment with its compile cache folders under ``folder`` and the
    shared bytecode cache (see the module docstring)."""
    environment = {key: value for key, value in os.environ.items()
                   if key != "PYTHONDONTWRITEBYTECODE"}
    return {
        **environment,
        "PYTHONPYCACHEPREFIX": str(folder / "bytecode"),
        "FASTCALC_CACHE_DIR": str(folder / fastcalc_cache),
        "TORCHINDUCTOR_CACHE_DIR": str(folder / torch_caches / "inductor"),
        "TRITON_CACHE_DIR": str(folder / torch_caches / "triton"),
    }


def _fill_bytecode_cache(env: dict[str, str], upstream: list[str]) -> None:
    """Import, untimed, what the timed processes import (``upstream``: the packages of the
    upstream calculators timed), so that their bytecode is cached (module docstring)."""
    modules = ["fastcalc.models", "fastcalc.bench.upstream", "ase.io", *COMPILER_MODULES, *upstream]
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)"
    subprocess.run([sys.executable, "-c", code, *modules], env=env, check=True,
                   capture_output=True)


#: fastcalc's progress line while it compiles or runs ("... the model: 00:12").
_PROGRESS = re.compile(r": \d\d:\d\d\s*$")


def _one_process(args: list[str], env: dict[str, str]) -> dict[str, float]:
    """Seconds from starting :data:`PROCESS` with ``ARGS`` to the moment it reports its
    first result (``first_result_s``) and its phases (``import_s``, ``build_s``,
    ``call_s``), and to its first compiled result (``compiled_s``, fastcalc's), less the
    time it spent importing fastcalc's helper for an upstream calculator; prints what
    fastcalc logged at INFO level (reading the model, its first call)."""
    start = time.time()
    done = subprocess.run(
        [sys.executable, str(PROCESS), *args], env=env, capture_output=True, text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"first-result process {args} failed:\n{done.stderr[-3000:]}")
    for line in done.stderr.splitlines():  # fastcalc's INFO lines, not its progress line
        if line.startswith("fastcalc: ") and not _PROGRESS.search(line):
            print(f"{args[0]} {args[1]}: {line}", flush=True)
    times = json.loads(done.stdout.strip().splitlines()[-1])
    harness = times["harness_s"]
    return {
        "first_result_s": times["done_at"] - start - harness,
        "import_s": times["imported_at"] - start,
        "build_s": times["built_at"] - times["imported_at"] - harness,
        "call_s": times["done_at"] - times["built_at"],
        "compiled_s": None if times["compiled_at"] is None else times["compiled_at"] - start,
    }


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
    _fill_bytecode_cache(runs[0][2], [UPSTREAM_PACKAGES[i] for i in impls if i != "fastcalc"])
    structure = folder / f"copper-{natoms}.traj"
    ase.io.write(structure, copper(natoms))
    records = []
    for impl, cache, env in runs:
        records.append(FirstResultRecord(
            date=today(), gpu=device_name(), torch=torch.__version__, model=model, impl=impl,
            cache=cache, natoms=natoms,
            **_one_process([family, impl, str(path), device, str(structure)], env),
        ))
    return records
