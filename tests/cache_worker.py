"""One process of the CUDA disk-cache tests: the calculator of model file ``sys.argv[1]``
(UMA task ``sys.argv[3]`` if given) on CUDA with the disk cache in ``sys.argv[2]``
evaluates one rattled copper cell and prints results, stats, seconds, the kernel
folders in its Triton cache (``TRITON_CACHE_DIR``, with their files) and what entered the
Triton cache keys of fastcalc's own kernels, as JSON."""

import json
import os
import shutil
import subprocess
import sys
import time

from ase import Atoms
from ase.build import bulk

from fastcalc.models import load_calculator


def cached_cell() -> Atoms:
    """The rattled copper cell each process evaluates (the tests' reference takes it too)."""
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.02, seed=9)
    return atoms


def kernel_folders(folder: str) -> dict[str, list[str]]:
    """Triton's kernel folders in ``folder``: their names and the files in each."""
    return {name: sorted(os.listdir(os.path.join(folder, name))) for name in os.listdir(folder)}


def record_cache_keys() -> dict[str, dict[str, str]]:
    """The parts of the Triton cache key of each kernel that Triton compiles in this
    process outside inductor (fastcalc's own kernels), by kernel name: so that a test can
    say why two processes' keys differ."""
    import triton.compiler.compiler as compiler

    records: dict[str, dict[str, str]] = {}
    cache_key = compiler.get_cache_key

    def recorded(src, backend, options, *args, **kwargs):
        function = getattr(src, "fn", None)
        name = getattr(function, "__name__", None) or repr(function)
        if not name.startswith("triton_"):  # inductor's kernels are named triton_*
            try:  # a diagnosis only: never fail the kernel's compilation
                records[name] = {
                    "source": src.hash(), "backend": backend.hash(),
                    "options": str(sorted(options.__dict__.items())),
                    "env": str(args or kwargs),
                    "stages_hook": repr(compiler.knobs.runtime.add_stages_inspection_hook),
                    "ptxas": os.environ.get("TRITON_PTXAS_PATH", ""),
                }
            except Exception as error:
                records[name] = {"error": repr(error)}
        return cache_key(src, backend, options, *args, **kwargs)

    compiler.get_cache_key = recorded
    return records


if __name__ == "__main__":
    cache_keys = record_cache_keys()
    start = time.perf_counter()
    task = sys.argv[3] if len(sys.argv) > 3 else None
    calc = load_calculator(sys.argv[1], task=task, device="cuda", cache_dir=sys.argv[2],
                           compile_in_background=False)
    atoms = cached_cell()
    atoms.calc = calc
    energy, forces, stress = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
    print(json.dumps({
        "energy": float(energy), "forces": forces.tolist(), "stress": stress.tolist(),
        "stats": calc.compile_stats, "seconds": time.perf_counter() - start,
        "kernels": kernel_folders(os.environ["TRITON_CACHE_DIR"]),
        "cache_keys": cache_keys,
    }))


def run_twice(model: str, folder, task: str | None = None) -> list[dict]:
    """Two fresh processes on ``model`` sharing only fastcalc's disk cache (under
    ``folder``; torch's caches empty in each, and the first's removed before the second
    starts, as on another node): their JSON reports."""
    runs = []
    for run in range(2):
        if run:
            shutil.rmtree(folder / "triton0")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / f"inductor{run}"),
               "TRITON_CACHE_DIR": str(folder / f"triton{run}")}
        done = subprocess.run(
            [sys.executable, __file__, str(model), str(folder / "cache"), *([task] if task else [])],
            env=env, capture_output=True, text=True, timeout=900,
        )
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs
