"""Fit the small demo PET model to the EMT copper data set with metatrain.

Writes ``options.yaml`` into a work directory (default ``scripts/demo/work/pet``, git
ignored), runs metatrain's trainer (``mtt train options.yaml -o model.pt``) there and copies
the exported metatomic model (TorchScript, what ``mtt export`` writes) to
``fastcalc/demo_models/pet-demo-cu.pt``.

Run ``python scripts/demo/make_dataset.py`` first. Then::

    OMP_NUM_THREADS=1 python scripts/demo/fit_pet.py            # CPU
    python scripts/demo/fit_pet.py --device cuda --epochs 150     # GPU

The hyper-parameters are in ``options()`` below; everything is seeded (``seed: 0``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import time

import yaml

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
TARGET = REPO / "fastcalc" / "demo_models" / "pet-demo-cu.pt"


def _target_section(path):
    return {
        "systems": {"read_from": str(path), "length_unit": "angstrom"},
        "targets": {
            "energy": {
                "key": "ref_energy",
                "unit": "eV",
                "forces": {"key": "ref_forces"},
                "stress": {"key": "ref_stress"},
            }
        },
    }


def options(data: pathlib.Path, epochs: int, batch_size: int, lr: float, device: str,
            num_workers: int = 0):
    opts = {
        "seed": 0,
        "base_precision": 32,
        "device": device,
        "architecture": {
            "name": "pet",
            "model": {
                "cutoff": 5.0,
                "cutoff_width": 0.5,
                "d_pet": 32,
                "d_head": 32,
                "d_node": 64,
                "d_feedforward": 64,
                "num_heads": 4,
                "num_attention_layers": 2,
                "num_gnn_layers": 1,
            },
            "training": {
                "batch_size": batch_size,
                "num_epochs": epochs,
                "learning_rate": lr,
                "warmup_fraction": 0.02,
                "num_workers": num_workers,
                "checkpoint_interval": 5,
                "loss": {
                    "energy": {
                        "type": "mse",
                        "weight": 1.0,
                        "gradients": {
                            "positions": {"type": "mse", "weight": 1.0},
                            "strain": {"type": "mse", "weight": 0.5},
                        },
                    }
                },
            },
        },
        "training_set": _target_section(data / "train.xyz"),
        "validation_set": _target_section(data / "val.xyz"),
        "test_set": _target_section(data / "test.xyz"),
    }
    return opts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(HERE / "data"))
    parser.add_argument("--workdir", default=str(HERE / "work" / "pet"))
    parser.add_argument("--out", default=str(TARGET))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()

    data = pathlib.Path(args.data).resolve()
    for name in ("train", "val", "test"):
        if not (data / f"{name}.xyz").exists():
            sys.exit(f"{data / name}.xyz missing: run scripts/demo/make_dataset.py first")
    work = pathlib.Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    opts = options(data, args.epochs, args.batch_size, args.lr, args.device,
                   args.num_workers)
    (work / "options.yaml").write_text(yaml.safe_dump(opts, sort_keys=False))

    env = dict(os.environ)
    if args.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
    start = time.time()
    with open(work / "train.log", "w") as log:
        subprocess.run([sys.executable, "-m", "metatrain", "train", "options.yaml", "-o", "model.pt"], cwd=work,
                       env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    elapsed = time.time() - start
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / "model.pt", out)
    print(f"trained in {elapsed / 60:.1f} min (mtt train, incl. final evaluation); "
          f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
