"""Time fastcalc's BucketedCalculator against fairchem's calculator on one UMA-S-shaped model.

Both sides load the same random-weight inference checkpoint, built with fairchem's
classes in the shape of UMA-S (4 layers, 128 channels, lmax = mmax = 2, 32 experts,
cutoff 6 A, max_neighbors 300, composition embedding; tasks oc20, omat, omol).
fastcalc: float32, compile_mode="reduce-overhead" (CUDA graphs per edge bucket).
fairchem: float32, merged experts, torch.compile(dynamic=True) (its predict unit
with merge_mole and compile on, general backend), TF32 off on both sides.
Each call is energy + forces + stress on rattled fcc copper (omat task).

    python benchmarks/uma_bench.py --device cuda --out benchmarks/results/uma-h200.json
    python benchmarks/uma_bench.py --device cpu --small --out /tmp/uma-small.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "uma"))
sys.path.insert(0, str(ROOT))
from uma_reference import build_checkpoint, default_backbone, fairchem_calculator  # noqa: E402

from fastcalc.bench import (  # noqa: E402
    BenchRecord,
    copper,
    plot_records,
    ratio_table,
    time_calculators,
    write_records,
)
from fastcalc.uma import BucketedCalculator  # noqa: E402

UMA_S = dict(
    sphere_channels=128, hidden_channels=128, edge_channels=128, num_distance_basis=64,
    num_layers=4, lmax=2, mmax=2, num_experts=32, cutoff=6.0, max_neighbors=300,
    use_composition_embedding=True, chg_spin_emb_type="rand_emb", moe_dropout=0.0,
)
TINY = dict(
    sphere_channels=8, hidden_channels=8, edge_channels=8, num_distance_basis=8,
    num_layers=1, lmax=1, mmax=1, num_experts=4, cutoff=4.0, max_neighbors=300,
)


def fairchem_compiled(path: Path, device: str):
    """fairchem's calculator as its fast path runs: merged experts, torch.compile, no TF32."""
    from fairchem.core.calculate.ase_calculator import FAIRChemCalculator
    from fairchem.core.units.mlip_unit.api.inference import InferenceSettings
    from fairchem.core.units.mlip_unit.predict import MLIPPredictUnit

    settings = InferenceSettings(
        tf32=False, merge_mole=True, compile=True, activation_checkpointing=False,
        external_graph_gen=False, execution_mode="general", base_precision_dtype=torch.float32,
    )
    unit = MLIPPredictUnit(str(path), device=device, inference_settings=settings)
    return FAIRChemCalculator(unit, task_name="omat")


def energies_agree(path: Path, device: str, natoms: int) -> float:
    """Relative energy difference, fastcalc on ``device`` against fairchem's eager CPU
    calculator, both float32: a check that both sides run the same model."""
    atoms = copper(natoms)
    values = []
    for calc in (
        fairchem_calculator(path, "omat", dtype=torch.float32),
        BucketedCalculator(path, task_name="omat", device=device, compile_mode=None),
    ):
        atoms.calc = calc
        values.append(atoms.get_potential_energy())
    return abs(values[0] - values[1]) / max(abs(values[0]), 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--out", type=Path, required=True, help="JSON file, or a folder for uma.json"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 108, 1008])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="tiny model, 32 atoms, few calls")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch._dynamo.config.recompile_limit = 64  # fairchem's dynamic compile, several sizes
    shape, model, sizes, calls, warmup = UMA_S, "UMA-S-shaped (random)", args.sizes, args.calls, 3
    if args.small:
        shape, model, sizes, calls, warmup = TINY, "tiny UMA (random)", [32], 3, 2
    out = args.out / "uma.json" if args.out.suffix != ".json" else args.out
    out.parent.mkdir(parents=True, exist_ok=True)

    records: list[BenchRecord] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "uma.pt"
        build_checkpoint(path, default_backbone(**shape), "UMA-S-1.2.1", seed=0)
        print(f"relative energy difference (float32, {sizes[0]} atoms): "
              f"{energies_agree(path, args.device, sizes[0]):.1e}", flush=True)
        for natoms in sizes:
            factories = {
                "fairchem": lambda: fairchem_compiled(path, args.device),
                "fastcalc": lambda: BucketedCalculator(
                    path, task_name="omat", device=args.device, compile_mode="reduce-overhead"
                ),
            }
            records += time_calculators(
                factories, copper(natoms), model, warmup=warmup, calls=calls
            )
            print(ratio_table(records, "fairchem"), flush=True)
            write_records(records, out)
    try:
        plot_records(records, out.with_suffix(".png"))
    except ImportError:  # matplotlib is optional
        pass
    print(f"\n{model}, {records[0].gpu}, torch {torch.__version__}; wrote {out}\n")
    print(ratio_table(records, "fairchem"))


if __name__ == "__main__":
    main()
