"""Molecular dynamics with ASE's own integrators, a progress bar and a short summary."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ase import Atoms, units
from ase.build import bulk
from ase.calculators.calculator import Calculator
from ase.io import Trajectory
from ase.md.langevin import Langevin
from ase.md.md import MolecularDynamics
from ase.md.nose_hoover_chain import IsotropicMTKNPT, NoseHooverChainNVT
from ase.md.velocitydistribution import Stationary, thermalize_momenta
from ase.md.verlet import VelocityVerlet
from tqdm.auto import tqdm

__all__ = ["ENSEMBLES", "MDSummary", "default_structure", "run_md"]

ENSEMBLES = ("nve", "langevin", "nvt", "npt")


@dataclass(frozen=True)
class MDSummary:
    """What an MD run did: speed, energy conservation, temperature."""

    steps: int
    natoms: int
    ms_per_step: float
    energy_drift_mev_per_atom: float
    mean_temperature_K: float
    final_temperature_K: float

    def __str__(self) -> str:
        return (
            f"{self.steps} steps of {self.natoms} atoms: {self.ms_per_step:.2f} ms/step (median), "
            f"total-energy drift {self.energy_drift_mev_per_atom:+.3f} meV/atom, "
            f"temperature {self.mean_temperature_K:.0f} K mean, {self.final_temperature_K:.0f} K final"
        )


def default_structure() -> Atoms:
    """A 108-atom fcc copper crystal."""
    return bulk("Cu", "fcc", a=3.61, cubic=True).repeat(3)


def _integrator(
    atoms: Atoms, ensemble: str, timestep_fs: float, temperature_K: float, **kwargs
) -> MolecularDynamics:
    dt = timestep_fs * units.fs
    if ensemble == "nve":
        return VelocityVerlet(atoms, timestep=dt, **kwargs)
    if ensemble == "langevin":
        return Langevin(
            atoms, dt, temperature_K=temperature_K, friction=0.01 / units.fs, fixcm=False, **kwargs
        )
    if ensemble == "nvt":
        return NoseHooverChainNVT(atoms, dt, temperature_K=temperature_K, tdamp=100 * dt, **kwargs)
    if ensemble == "npt":
        if not atoms.pbc.all():
            raise ValueError("npt needs a system periodic along all three axes")
        return IsotropicMTKNPT(
            atoms, dt, temperature_K=temperature_K, pressure_au=0.0, tdamp=100 * dt,
            pdamp=1000 * dt, **kwargs,
        )
    raise ValueError(f"unknown ensemble {ensemble!r}; choose one of {', '.join(ENSEMBLES)}")


def run_md(
    atoms: Atoms,
    calculator: Calculator,
    *,
    steps: int = 100,
    timestep_fs: float = 2.0,
    temperature_K: float = 300.0,
    ensemble: str = "nve",
    trajectory: str | Path | None = None,
    log: str | Path | None = None,
    interval: int = 10,
    seed: int = 0,
    progress: bool = True,
) -> MDSummary:
    """Run ``steps`` of MD from velocities drawn at ``temperature_K``.

    Writes every ``interval``-th frame (positions, energy, forces) to
    ``trajectory`` and ASE's MD log to ``log`` when given.
    """
    atoms.calc = calculator
    thermalize_momenta(atoms, temperature_K, rng=np.random.default_rng(seed))
    Stationary(atoms)
    extra = {"logfile": str(log), "loginterval": interval} if log else {}
    dyn = _integrator(atoms, ensemble, timestep_fs, temperature_K, **extra)
    if trajectory:
        writer = Trajectory(str(trajectory), "w", atoms)
        dyn.attach(writer.write, interval=interval)
    start_energy = atoms.get_total_energy()
    temperatures: list[float] = []
    step_ms: list[float] = []
    bar = tqdm(total=steps, unit="step", disable=not progress)
    last = time.perf_counter()

    def observe() -> None:
        nonlocal last
        now = time.perf_counter()
        if dyn.nsteps > 0:
            step_ms.append((now - last) * 1e3)
            bar.update(1)
            bar.set_postfix_str(f"{step_ms[-1]:.1f} ms/step, {atoms.get_temperature():.0f} K")
        temperatures.append(atoms.get_temperature())
        last = now

    dyn.attach(observe, interval=1)
    try:
        dyn.run(steps)
    finally:
        bar.close()
        if trajectory:
            writer.close()
    drift = (atoms.get_total_energy() - start_energy) / len(atoms)
    return MDSummary(
        steps=steps,
        natoms=len(atoms),
        ms_per_step=float(np.median(step_ms)) if step_ms else float("nan"),
        energy_drift_mev_per_atom=drift * 1e3,
        mean_temperature_K=float(np.mean(temperatures)),
        final_temperature_K=atoms.get_temperature(),
    )
