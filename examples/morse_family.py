"""A third model family in one file: Morse potentials stored as ``*.morse.json``.

Shows what adding a model to fastcalc takes: a calculator (here the generic
``PotentialCalculator`` around a torch energy), a test that recognises the family's
files, and one ``register`` call. ``load_calculator`` (and so ``fastcalc md``) then
finds the family from the file, and ``check_calculator`` checks the calculator against
ASE's own Morse potential.
Run: python examples/morse_family.py
"""

import json
import tempfile
from pathlib import Path

import torch
from ase.calculators.morse import MorsePotential

from fastcalc import PotentialCalculator
from fastcalc.geometry import edge_vectors
from fastcalc.models import load_calculator
from fastcalc.registry import ModelFamily, TaskNotSupportedError, register
from fastcalc.testing import check_calculator


def morse_calculator(
    path: Path, *, task, device, dtype, compile_mode, **options
) -> PotentialCalculator:
    """ASE's Morse form (pair energy times a smooth cutoff) with the file's parameters;
    a Morse potential has no tasks, so one asked for is refused rather than ignored."""
    if task is not None:
        raise TaskNotSupportedError(f"Morse potentials have no tasks, got task {task!r}")
    p = json.loads(path.read_text())
    r0, cut1, cut2 = p["r0"], p["rcut1"] * p["r0"], p["rcut2"] * p["r0"]

    def energy(positions, cell, numbers, edges):
        r = edge_vectors(positions, cell, edges.edge_index, edges.unit_shifts).norm(dim=1)
        e = torch.exp(p["rho0"] * (1 - r / r0))
        s = (1 - (r - cut1) / (cut2 - cut1)).clamp(0, 1)
        return 0.5 * (p["epsilon"] * e * (e - 2) * s**3 * (6 * s**2 - 15 * s + 10)).sum()

    return PotentialCalculator(energy, cut2, device=device, dtype=dtype, **options)


register(
    ModelFamily(
        name="morse",
        formats="Morse parameters (.morse.json)",
        recognises=lambda path: path.name.endswith(".morse.json"),
        build=morse_calculator,
    )
)

if __name__ == "__main__":
    parameters = dict(epsilon=0.4, rho0=5.0, r0=2.6, rcut1=1.5, rcut2=2.2)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "copper.morse.json"
        path.write_text(json.dumps(parameters))
        calc = load_calculator(path, device="cpu", dtype="float64")
    report = check_calculator(calc, MorsePotential(**parameters), numbers=[29])
    passed, skipped = (len(report.with_status(status)) for status in ("passed", "skipped"))
    print(f"{type(calc).__name__} from {path.name}: {passed} checks passed, {skipped} skipped")
