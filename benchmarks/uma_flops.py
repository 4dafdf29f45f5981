"""Matrix-product arithmetic of one UMA call: fastcalc against fairchem, same checkpoint.

Counts the floating-point operations of matrix products (torch's ``FlopCounterMode``)
in one energy + forces + stress call on rattled fcc copper, for fastcalc's eager core and
for fairchem's calculator uncompiled on its ``general`` and ``umas_fast_pytorch``
backends (``umas_fast_gpu`` needs CUDA; it runs the same products as
``umas_fast_pytorch`` with Triton kernels around them), all on the random UMA-S-shaped
checkpoint of ``fastcalc bench uma``. Products written as Triton kernels (fastcalc's
Wigner rotations) are not counted.

    python benchmarks/uma_flops.py --atoms 32
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

from ase.calculators.calculator import Calculator, all_changes
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fastcalc.bench import copper  # noqa: E402
from fastcalc.bench.suite import uma_contest  # noqa: E402
from fastcalc.bench.upstream import fairchem_preset_calculator  # noqa: E402
from fastcalc.uma.calculator import BucketedCalculator  # noqa: E402


def flops(calc: Calculator, natoms: int) -> dict[str, int]:
    """FLOPs per matrix-product operator of one call, after an uncounted first call."""
    atoms = copper(natoms)
    calc.calculate(atoms.copy(), ["energy", "forces", "stress"], all_changes)
    atoms.rattle(0.01, seed=1)
    with FlopCounterMode(display=False) as counter:
        calc.calculate(atoms, ["energy", "forces", "stress"], all_changes)
    return {str(op): count for op, count in counter.get_flop_counts()["Global"].items()}


def fairchem(path: Path, mode: str) -> Calculator:
    """fairchem's ``high-precision`` preset on CPU, uncompiled, on backend ``mode``."""
    from fairchem.core.units.mlip_unit.api.inference import guess_inference_settings

    settings = replace(guess_inference_settings("high-precision"), compile=False)
    return fairchem_preset_calculator(path, "omat", "cpu", settings, execution_mode=mode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--atoms", type=int, default=32)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as folder:  # the UMA-S-shaped checkpoint: 1.1 GB
        count(uma_contest(Path(folder), "cpu", small=False).path, args.atoms)


def count(path: Path, atoms: int) -> None:
    """Print each contender's matrix-product GFLOP of one call on ``atoms`` atoms."""
    contenders = {
        "fastcalc": lambda: BucketedCalculator(path, task_name="omat", device="cpu",
                                               compile_mode="eager"),
        "fairchem general": lambda: fairchem(path, "general"),
        "fairchem umas_fast_pytorch": lambda: fairchem(path, "umas_fast_pytorch"),
    }
    print(f"matrix-product GFLOP of one call, {atoms} atoms:")
    for name, build in contenders.items():
        counts = flops(build(), atoms)
        parts = ", ".join(f"{op} {n / 1e9:.2f}" for op, n in sorted(counts.items()))
        print(f"  {name:28s} {sum(counts.values()) / 1e9:8.2f}  ({parts})", flush=True)


if __name__ == "__main__":
    main()
