"""Evaluate the shipped demo models with their UPSTREAM calculators against EMT.

- PET (``fastcalc/demo_models/pet-demo-cu.pt``): metatomic's ``MetatomicCalculator``;
- UMA (``fastcalc/demo_models/uma-demo-cu.pt``): fairchem's ``FAIRChemCalculator`` on
  ``load_predict_unit(path)``, task ``omat``.

On the held-out test set (``scripts/demo/data/test.xyz``, seed 1) it reports the energy
MAE (meV/atom) and force MAE (eV/A, over all Cartesian components) per structure kind,
and the total-energy drift of a 200-step NVE run (ASE VelocityVerlet, 2 fs, fcc Cu
3x3x3 cubic = 108 atoms at a = 3.59 A, Maxwell-Boltzmann velocities at 300 K, seed 0).
Drift = |E_tot(end) - E_tot(start)| / N and max |E_tot(t) - E_tot(start)| / N.

Prints a markdown table and writes it to ``scripts/demo/RESULTS.md``.

    OMP_NUM_THREADS=1 python scripts/demo/evaluate.py
"""

from __future__ import annotations

import argparse
import pathlib
import time
import warnings

import numpy as np
from ase import units
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.io import read
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary
from ase.md.verlet import VelocityVerlet

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODELS = REPO / "fastcalc" / "demo_models"
KINDS = ("bulk", "strained", "vacancy", "surface100", "surface111", "cluster")
TARGETS = {"energy": 15.0, "forces": 0.15, "drift": 2.0}


def pet_calculator(path, device="cpu"):
    try:
        from metatomic_ase import MetatomicCalculator
    except ImportError:  # older metatomic
        from metatomic.torch.ase_calculator import MetatomicCalculator
    return MetatomicCalculator(str(path), device=device)


def uma_calculator(path, device="cpu"):
    from fairchem.core.calculate.ase_calculator import FAIRChemCalculator
    from fairchem.core.units.mlip_unit import load_predict_unit
    from fairchem.core.units.mlip_unit.api.inference import InferenceSettings

    # plain FP32 eager model: no MoLE merge / torch.compile (the default "multigpu"
    # settings merge the experts for one composition and compile, and fall back to
    # this when the composition changes, as it does across the test set)
    settings = InferenceSettings(tf32=False, merge_mole=False, compile=False)
    predict_unit = load_predict_unit(str(path), device=device,
                                     inference_settings=settings)
    return FAIRChemCalculator(predict_unit, task_name="omat")


def test_errors(calc, frames):
    per_kind = {k: {"e": [], "f": []} for k in KINDS}
    for atoms in frames:
        a = atoms.copy()
        a.calc = calc
        e = a.get_potential_energy()
        f = a.get_forces()
        kind = atoms.info["kind"]
        per_kind[kind]["e"].append(abs(e - atoms.info["ref_energy"]) / len(a))
        per_kind[kind]["f"].append(np.abs(f - atoms.arrays["ref_forces"]).reshape(-1))
    rows = {}
    all_e, all_f = [], []
    for kind in KINDS:
        e = np.array(per_kind[kind]["e"])
        f = np.concatenate(per_kind[kind]["f"])
        all_e.append(e)
        all_f.append(f)
        rows[kind] = (1000 * e.mean(), f.mean(), len(e))
    e = np.concatenate(all_e)
    f = np.concatenate(all_f)
    rows["all"] = (1000 * e.mean(), f.mean(), len(e))
    return rows


def nve_drift(calc, steps=200, timestep_fs=2.0, temperature=300.0, seed=0):
    atoms = bulk("Cu", "fcc", a=3.59, cubic=True) * (3, 3, 3)
    atoms.calc = calc
    MaxwellBoltzmannDistribution(atoms, temperature_K=temperature,
                                 rng=np.random.default_rng(seed))
    Stationary(atoms)
    energies = []

    def record():
        energies.append(atoms.get_potential_energy() + atoms.get_kinetic_energy())

    dyn = VelocityVerlet(atoms, timestep_fs * units.fs)
    dyn.attach(record, interval=1)
    start = time.time()
    dyn.run(steps)
    elapsed = time.time() - start
    e = np.array(energies)
    n = len(atoms)
    return (1000 * abs(e[-1] - e[0]) / n, 1000 * np.abs(e - e[0]).max() / n,
            atoms.get_temperature(), elapsed / steps, n)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(HERE / "data" / "test.xyz"))
    parser.add_argument("--pet", default=str(MODELS / "pet-demo-cu.pt"))
    parser.add_argument("--uma", default=str(MODELS / "uma-demo-cu.pt"))
    parser.add_argument("--models", nargs="+", default=["pet", "uma"])
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--timestep", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    frames = read(args.data, ":")
    makers = {"pet": lambda: pet_calculator(args.pet),
              "uma": lambda: uma_calculator(args.uma)}
    paths = {"pet": args.pet, "uma": args.uma}
    names = {"pet": "PET (metatomic MetatomicCalculator)",
             "uma": "UMA (fairchem FAIRChemCalculator, task omat)"}

    lines = ["# Demo models vs EMT copper", "",
             f"Held-out test set: `{pathlib.Path(args.data).name}` ({len(frames)} "
             "structures, seed 1). Energy MAE in meV/atom, force MAE in eV/A (all "
             "Cartesian components). NVE: fcc Cu 108 atoms, VelocityVerlet "
             f"{args.timestep:g} fs, {args.steps} steps, 300 K start; drift = "
             "|E_tot(end) - E_tot(0)| / N, max dev = max_t |E_tot(t) - E_tot(0)| / N "
             f"(meV/atom). Targets: energy < {TARGETS['energy']:g} meV/atom, forces < "
             f"{TARGETS['forces']:g} eV/A, drift < {TARGETS['drift']:g} meV/atom.", ""]
    header = ("| model | size (MB) | " + " | ".join(f"{k} E / F" for k in KINDS)
              + " | **all E** | **all F** | NVE drift | NVE max dev | s/step (CPU) |")
    lines += [header, "|" + "---|" * (header.count("|") - 1)]

    # reference row: EMT itself (energy conservation of the integrator)
    d_end, d_max, _, per_step, _ = nve_drift(EMT(), args.steps, args.timestep)
    emt_row = ("| EMT (reference) | - | " + " | ".join("0 / 0" for _ in KINDS)
               + f" | 0 | 0 | {d_end:.3f} | {d_max:.3f} | {per_step:.4f} |")

    for model in args.models:
        calc = makers[model]()
        start = time.time()
        rows = test_errors(calc, frames)
        t_test = time.time() - start
        d_end, d_max, temp, per_step, n = nve_drift(makers[model](), args.steps,
                                                    args.timestep)
        size = pathlib.Path(paths[model]).stat().st_size / 1e6
        cells = " | ".join(f"{rows[k][0]:.1f} / {rows[k][1]:.3f}" for k in KINDS)
        ok = (rows["all"][0] < TARGETS["energy"] and rows["all"][1] < TARGETS["forces"]
              and d_end < TARGETS["drift"])
        lines.append(f"| {names[model]} | {size:.2f} | {cells} | **{rows['all'][0]:.2f}** "
                     f"| **{rows['all'][1]:.4f}** | {d_end:.3f} | {d_max:.3f} | "
                     f"{per_step:.3f} |")
        print(f"{model}: test set evaluated in {t_test:.0f} s; NVE final T {temp:.0f} K; "
              f"targets {'met' if ok else 'NOT met'}", flush=True)
    lines.append(emt_row)
    counts = {k: sum(a.info["kind"] == k for a in frames) for k in KINDS}
    lines += ["", "Test structures per kind: "
              + ", ".join(f"{k} {v}" for k, v in counts.items()) + "."]
    table = "\n".join(lines) + "\n"
    print(table)
    pathlib.Path(args.out).write_text(table)


if __name__ == "__main__":
    main()
