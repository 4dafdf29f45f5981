"""Molecular dynamics with ASE's own integrators, a progress bar and a short summary."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ase import Atoms, units
from ase.build import bulk
from ase.calculators.calculator import Calculator
from ase.io import Trajectory, write
from ase.md.langevin import Langevin
from ase.md.md import MolecularDynamics
from ase.md.nose_hoover_chain import IsotropicMTKNPT, NoseHooverChainNVT
from ase.md.velocitydistribution import Stationary, thermalize_momenta
from ase.md.verlet import VelocityVerlet

from .progress import progress_bar

__all__ = [
    "ENSEMBLES",
    "NPT_PRESSURE_GPA",
    "TRAJECTORY_FORMATS",
    "MDSetupError",
    "MDSummary",
    "check_run",
    "default_structure",
    "run_md",
    "trajectory_format",
]

ENSEMBLES = ("nve", "langevin", "nvt", "npt")

#: The pressure the NPT barostat holds, in GPa.
NPT_PRESSURE_GPA = 0.0

#: Trajectory file suffixes and the ASE format written for each: those that keep
#: energies and forces and take one frame after another.
TRAJECTORY_FORMATS = {".traj": "traj", ".xyz": "extxyz", ".extxyz": "extxyz"}


class MDSetupError(ValueError):
    """An MD run that cannot mean anything: no steps, a zero timestep, a negative
    temperature, an unknown ensemble, NPT without periodicity, an unwritable trajectory."""


@dataclass(frozen=True)
class MDSummary:
    """What an MD run did: speed, temperature, and what its ensemble conserves or holds.

    ``energy_drift_mev_per_atom`` is set for NVE only (the thermostats exchange energy by
    design); ``mean_volume_A3`` and ``mean_pressure_GPa`` for NPT only.
    """

    steps: int
    natoms: int
    ensemble: str
    ms_per_step: float
    start_temperature_K: float
    mean_temperature_K: float
    final_temperature_K: float
    energy_drift_mev_per_atom: float | None = None
    mean_volume_A3: float | None = None
    mean_pressure_GPa: float | None = None

    def __str__(self) -> str:
        start = self.start_temperature_K
        lines = [f"{self.steps} steps of {self.natoms} atoms ({self.ensemble}): "
                 f"{self.ms_per_step:.2f} ms/step (median)"]
        temperature = (f"temperature {self.mean_temperature_K:.0f} K mean, "
                       f"{self.final_temperature_K:.0f} K final")
        if self.ensemble != "nve":
            temperature += f" (thermostat at {start:g} K)"
        elif start > 0:
            temperature += (
                f"; velocities were drawn at {start:g} K, and from a relaxed structure NVE "
                f"settles near T/2 = {start / 2:g} K (equipartition: half the kinetic energy "
                f"becomes potential energy)"
            )
        lines.append(temperature)
        if self.energy_drift_mev_per_atom is not None:
            lines.append(f"total-energy drift {self.energy_drift_mev_per_atom:+.3f} meV/atom")
        if self.mean_volume_A3 is not None and self.mean_pressure_GPa is not None:
            lines.append(
                f"volume {self.mean_volume_A3:.1f} A^3 mean "
                f"({self.mean_volume_A3 / self.natoms:.2f} A^3/atom), pressure "
                f"{self.mean_pressure_GPa:+.2f} GPa mean (barostat at {NPT_PRESSURE_GPA:g} GPa)"
            )
        return "\n".join(lines)


def default_structure(repeat: int = 3) -> Atoms:
    """An fcc copper crystal of ``repeat``³ cubic cells: 108 atoms, or 32 for ``repeat=2``."""
    return bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)


def trajectory_format(path: str | Path) -> str:
    """The ASE format :func:`run_md` writes to ``path``, from its suffix; raises
    :class:`MDSetupError` for a suffix without energies and forces or frame by frame."""
    suffix = Path(path).suffix.lower()
    if suffix not in TRAJECTORY_FORMATS:
        raise MDSetupError(
            f"cannot write an MD trajectory with energies and forces to {str(path)!r}: "
            f"use {', '.join(TRAJECTORY_FORMATS)}"
        )
    return TRAJECTORY_FORMATS[suffix]


def check_run(
    atoms: Atoms,
    *,
    steps: int,
    timestep_fs: float,
    temperature_K: float,
    ensemble: str,
    trajectory: str | Path | None = None,
    log: str | Path | None = None,
) -> None:
    """Raise :class:`MDSetupError` naming what makes this run meaningless or its files
    unwritable; cheap, so that a command line can check before it loads a model."""
    if steps < 1:
        raise MDSetupError(f"steps must be at least 1, got {steps}")
    if not timestep_fs > 0:
        raise MDSetupError(f"the timestep must be positive, got {timestep_fs:g} fs")
    if not temperature_K >= 0:
        raise MDSetupError(f"the temperature must not be negative, got {temperature_K:g} K")
    if ensemble not in ENSEMBLES:
        raise MDSetupError(f"unknown ensemble {ensemble!r}; choose one of {', '.join(ENSEMBLES)}")
    if ensemble == "npt" and not atoms.pbc.all():
        raise MDSetupError(
            f"npt needs a system periodic along all three axes; pbc={atoms.pbc.tolist()}"
        )
    if trajectory:
        trajectory_format(trajectory)
    for what, path in (("trajectory", trajectory), ("log", log)):
        if path and not Path(path).parent.is_dir():
            raise MDSetupError(f"no folder {str(Path(path).parent)!r} for the {what} "
                               f"{str(path)!r}")


def _integrator(
    atoms: Atoms, ensemble: str, timestep_fs: float, temperature_K: float, **kwargs
) -> MolecularDynamics:
    """ASE's integrator for ``ensemble`` (checked by :func:`check_run`)."""
    dt = timestep_fs * units.fs
    if ensemble == "nve":
        return VelocityVerlet(atoms, timestep=dt, **kwargs)
    if ensemble == "langevin":
        return Langevin(
            atoms, dt, temperature_K=temperature_K, friction=0.01 / units.fs, fixcm=False, **kwargs
        )
    if ensemble == "nvt":
        return NoseHooverChainNVT(atoms, dt, temperature_K=temperature_K, tdamp=100 * dt, **kwargs)
    return IsotropicMTKNPT(
        atoms, dt, temperature_K=temperature_K, pressure_au=NPT_PRESSURE_GPA * units.GPa,
        tdamp=100 * dt, pdamp=1000 * dt, **kwargs,
    )


def _frame_writer(path: str | Path, atoms: Atoms, stack: ExitStack) -> Callable[[], None]:
    """A function that appends the current frame of ``atoms`` (with the calculator's
    energy and forces) to ``path`` in its suffix's format; ``stack`` closes the file."""
    if trajectory_format(path) == "traj":
        return stack.enter_context(Trajectory(str(path), "w", atoms)).write
    handle = stack.enter_context(open(path, "w"))
    return lambda: write(handle, atoms, format="extxyz")


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

    Writes every ``interval``-th frame (positions, energy, forces) to ``trajectory``
    (ASE trajectory for ``.traj``, extended XYZ for ``.xyz`` and ``.extxyz``; an existing
    file is overwritten) and appends ASE's MD log to ``log`` when given. Raises
    :class:`MDSetupError` before anything runs if the run cannot mean anything or a file
    cannot be written (see :func:`check_run`).
    """
    check_run(atoms, steps=steps, timestep_fs=timestep_fs, temperature_K=temperature_K,
              ensemble=ensemble, trajectory=trajectory, log=log)
    atoms.calc = calculator
    thermalize_momenta(atoms, temperature_K, rng=np.random.default_rng(seed))
    Stationary(atoms)
    extra = {"logfile": str(log), "loginterval": interval} if log else {}
    dyn = _integrator(atoms, ensemble, timestep_fs, temperature_K, **extra)
    temperatures: list[float] = []
    volumes: list[float] = []
    pressures: list[float] = []
    step_ms: list[float] = []
    start_energy = atoms.get_total_energy()  # the model's refusals come before any file
    with ExitStack() as stack:
        if trajectory:
            dyn.attach(_frame_writer(trajectory, atoms, stack), interval=interval)
        bar = stack.enter_context(progress_bar(total=steps, unit="step", disable=not progress))
        last = time.perf_counter()

        def observe() -> None:
            nonlocal last
            now = time.perf_counter()
            if dyn.nsteps > 0:
                step_ms.append((now - last) * 1e3)
                # shown at the bar's next redraw (which update times)
                bar.set_postfix_str(
                    f"{step_ms[-1]:.1f} ms/step, {atoms.get_temperature():.0f} K", refresh=False
                )
                bar.update(1)
            temperatures.append(atoms.get_temperature())
            if ensemble == "npt":  # the barostat has just evaluated this stress
                volumes.append(atoms.get_volume())
                stress = atoms.get_stress(include_ideal_gas=True)
                pressures.append(float(-stress[:3].mean() / units.GPa))
            last = now

        dyn.attach(observe, interval=1)
        dyn.run(steps)
    drift = float(atoms.get_total_energy() - start_energy) / len(atoms)
    return MDSummary(
        steps=steps,
        natoms=len(atoms),
        ensemble=ensemble,
        ms_per_step=float(np.median(step_ms)),
        start_temperature_K=temperature_K,
        mean_temperature_K=float(np.mean(temperatures)),
        final_temperature_K=float(atoms.get_temperature()),
        energy_drift_mev_per_atom=drift * 1e3 if ensemble == "nve" else None,
        mean_volume_A3=float(np.mean(volumes)) if volumes else None,
        mean_pressure_GPa=float(np.mean(pressures)) if pressures else None,
    )
