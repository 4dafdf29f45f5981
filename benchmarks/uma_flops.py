"""Matrix-product arithmetic of one UMA call: fastcalc against fairchem, same checkpoint.

Counts the floating-point operations of matrix products (torch's ``FlopCounterMode``)
in one energy + forces + stress call on rattled fcc copper, for fastcalc's eager core and
for fairchem's calculator uncompiled on its ``general`` and ``umas_fast_pytorch``
backends (``umas_fast_gpu`` needs CUDA; it runs the same products as
``umas_fast_pytorch`` with Triton kernels around them), all on the random UMA-S-shaped
checkpoint of ``fastcalc bench uma``. Products written as Triton kernels (fastcalc's
Wigner rotations) are not counted.

    python benchmarks/uma_flops.py --atoms 32

``--shapes`` prints instead fastcalc's products alone, grouped by operator and shape
(inner size K -> outer size N; ``bmm`` with its batch), with their share of the call's
arithmetic: which maps a change such as Gauss's three products would shrink.

    python benchmarks/uma_flops.py --atoms 108 --shapes
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

from ase.calculators.calculator import Calculator, all_changes
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fastcalc.bench import copper  # noqa: E402
from fastcalc.bench.suite import uma_contest  # noqa: E402
from fastcalc.bench.upstream import fairchem_preset_calculator  # noqa: E402
from fastcalc.uma.calculator import BucketedCalculator  # noqa: E402


def counted_call(calc: Calculator, natoms: int, mode: TorchDispatchMode) -> None:
    """One energy + forces + stress call on rattled copper within ``mode`` (a counter),
    after an uncounted first call."""
    atoms = copper(natoms)
    calc.calculate(atoms.copy(), ["energy", "forces", "stress"], all_changes)
    atoms.rattle(0.01, seed=1)
    with mode:
        calc.calculate(atoms, ["energy", "forces", "stress"], all_changes)


def flops(calc: Calculator, natoms: int) -> dict[str, int]:
    """FLOPs per matrix-product operator of one call, after an uncounted first call."""
    counter = FlopCounterMode(display=False)
    counted_call(calc, natoms, counter)
    return {str(op): count for op, count in counter.get_flop_counts()["Global"].items()}


#: Matrix products by the position of their two operands in the call's arguments.
_PRODUCTS = {"aten.mm": 0, "aten.bmm": 0, "aten.addmm": 1, "aten.baddbmm": 1}


class ProductShapes(TorchDispatchMode):
    """FLOPs of the matrix products run within it (as :class:`FlopCounterMode` counts
    them), by (operator, batch, K, N)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter = Counter()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func.overloadpacket)
        if name in _PRODUCTS:
            a, b = args[_PRODUCTS[name]:_PRODUCTS[name] + 2]
            key = (name, a.shape[0] if a.dim() == 3 else 1, a.shape[-1], b.shape[-1])
            self.flops[key] += flop_registry[func.overloadpacket](*args, **kwargs, out_val=out)
            self.calls[key] += 1
        return out


def shapes(path: Path, natoms: int, top: int = 25) -> None:
    """Print fastcalc's products of one call by operator and shape, largest first."""
    calc = BucketedCalculator(path, task_name="omat", device="cpu", compile_mode="eager")
    products = ProductShapes()
    counted_call(calc, natoms, products)
    total = sum(products.flops.values())
    print(f"fastcalc's matrix products of one call, {natoms} atoms: {total / 1e9:.1f} GFLOP")
    for (name, batch, k, n), value in products.flops.most_common(top):
        batched = f"{batch} x " if name in ("aten.bmm", "aten.baddbmm") else ""
        print(f"  {name:12s} {batched}{k:5d} -> {n:5d}  {value / 1e9:8.2f} GFLOP "
              f"{100 * value / total:5.1f} %  ({products.calls[name, batch, k, n]} calls)")


def fairchem(path: Path, mode: str) -> Calculator:
    """fairchem's ``high-precision`` preset on CPU, uncompiled, on backend ``mode``."""
    from fairchem.core.units.mlip_unit.api.inference import guess_inference_settings

    settings = replace(guess_inference_settings("high-precision"), compile=False)
    return fairchem_preset_calculator(path, "omat", "cpu", settings, execution_mode=mode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--atoms", type=int, default=32)
    parser.add_argument("--shapes", action="store_true",
                        help="fastcalc's products alone, by operator and shape")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as folder:  # the UMA-S-shaped checkpoint: 1.1 GB
        path = uma_contest(Path(folder), "cpu", small=False).path
        (shapes if args.shapes else count)(path, args.atoms)


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
