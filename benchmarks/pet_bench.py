"""Time fastcalc's CompiledPETCalculator against metatomic's ASE calculator on one PET.

The model is the PET-S-shaped anchor of ``/work/shared/gpu/anchors/pet_anchor.py``:
metatrain's PET with d_pet 256, d_node 512, d_head 256, d_feedforward 512, 8 heads,
3 GNN layers of 1 attention layer, cutoff 8 A with adaptive cutoffs (16 neighbours),
metatrain's random initialisation after ``torch.manual_seed(0)``, Cu only, exported
to a metatomic ``.pt`` that both sides load. fastcalc: float32, default compile mode
(CUDA graphs on CUDA); metatomic: its eager TorchScript model in float32. Each call
is energy + forces + stress of rattled fcc copper. One calculator of each kind serves
every size, so fastcalc's first ``warmup_s`` includes compiling the model.

    python benchmarks/pet_bench.py --device cuda --out benchmarks/results/pet-h200.json
    python benchmarks/pet_bench.py --device cpu --small --out /tmp/pet-small.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from ase.calculators.calculator import Calculator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fastcalc.bench import (  # noqa: E402
    BenchRecord,
    copper,
    plot_records,
    ratio_table,
    time_calculators,
    write_records,
)
from fastcalc.pet import CompiledPETCalculator  # noqa: E402

PET_S = dict(
    d_pet=256, d_node=512, d_head=256, d_feedforward=512, num_heads=8, num_gnn_layers=3,
    num_attention_layers=1, cutoff=8.0, num_neighbors_adaptive=16,
)
TINY = dict(
    d_pet=16, d_node=32, d_head=16, d_feedforward=32, num_heads=2, num_gnn_layers=1,
    num_attention_layers=1, cutoff=8.0, num_neighbors_adaptive=16,
)


def export_pet(hypers: dict, path: Path) -> None:
    """metatrain's PET for Cu with ``hypers`` over its defaults, seed 0, saved as metatomic."""
    from metatrain.pet import PET
    from metatrain.utils.architectures import get_default_hypers
    from metatrain.utils.data import DatasetInfo
    from metatrain.utils.data.target_info import get_energy_target_info

    torch.manual_seed(0)
    model_hypers = get_default_hypers("pet")["model"]
    model_hypers.update(hypers)
    energy = get_energy_target_info("energy", {"quantity": "energy", "unit": "eV"})
    info = DatasetInfo(length_unit="Angstrom", atomic_types=[29], targets={"energy": energy})
    PET(model_hypers, info).eval().export().save(str(path))


def metatomic(path: Path, device: str) -> Calculator:
    from metatomic_ase import MetatomicCalculator

    return MetatomicCalculator(str(path), device=device)


def agreement(path: Path, device: str, natoms: int) -> tuple[float, float]:
    """Relative energy and force differences, eager fastcalc against metatomic (float32):
    a check that both sides run the same model."""
    atoms = copper(natoms)
    values = []
    ours = CompiledPETCalculator(path, device=device, compile=False)
    for calc in (metatomic(path, device), ours):
        atoms.calc = calc
        values.append((atoms.get_potential_energy(), atoms.get_forces()))
    (energy, forces), (our_energy, our_forces) = values
    return (
        abs(our_energy - energy) / max(abs(energy), 1.0),
        float(np.abs(our_forces - forces).max() / max(np.abs(forces).max(), 1e-12)),
    )


def once(factory: Callable[[], Calculator]) -> Callable[[], Calculator]:
    """A factory that builds its calculator at the first call and then returns it again."""
    built: list[Calculator] = []

    def get() -> Calculator:
        if not built:
            built.append(factory())
        return built[0]

    return get


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True, help="JSON file of records")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 108, 1008])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="tiny model, 32 atoms, few calls")
    args = parser.parse_args()
    hypers, model, sizes, calls, warmup = PET_S, "pet-s-random", args.sizes, args.calls, 3
    if args.small:
        hypers, model, sizes, calls, warmup = TINY, "pet-tiny-random", [32], 3, 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore", message=".*compiles the model at its first call.*")

    records: list[BenchRecord] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{model}.pt"
        export_pet(hypers, path)
        energy_error, force_error = agreement(path, args.device, sizes[0])
        print(
            f"eager fastcalc vs metatomic (float32, {sizes[0]} atoms): relative energy "
            f"difference {energy_error:.1e}, forces {force_error:.1e}",
            flush=True,
        )
        factories = {
            "metatomic": once(lambda: metatomic(path, args.device)),
            "fastcalc": once(lambda: CompiledPETCalculator(path, device=args.device)),
        }
        for natoms in sizes:
            records += time_calculators(
                factories, copper(natoms), model, warmup=warmup, calls=calls
            )
            print(ratio_table(records, "metatomic"), flush=True)
            write_records(records, args.out)
    try:
        plot_records(records, args.out.with_suffix(".png"))
    except ImportError:  # matplotlib is optional
        pass
    print(f"\n{model}, {records[0].gpu}, torch {torch.__version__}; wrote {args.out}\n")
    print(ratio_table(records, "metatomic"))


if __name__ == "__main__":
    main()
