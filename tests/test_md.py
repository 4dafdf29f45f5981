"""fastcalc.md.run_md drives ASE's integrators and reports what happened."""

import io
import sys

import pytest
from ase import units
from ase.io import read
from pair_potential import CUTOFF, morse_energy, with_ase_morse

from fastcalc import PotentialCalculator
from fastcalc.md import ENSEMBLES, MDSetupError, default_structure, run_md


def morse():
    return PotentialCalculator(morse_energy, CUTOFF, device="cpu", dtype="float64")


def test_nve_conserves_energy_and_writes_trajectory_and_log(tmp_path):
    atoms = default_structure()
    summary = run_md(atoms, morse(), steps=20, timestep_fs=2.0, temperature_K=300,
                     trajectory=tmp_path / "md.traj", log=tmp_path / "md.log", interval=5,
                     progress=False)
    assert summary.steps == 20 and summary.natoms == 108
    assert abs(summary.energy_drift_mev_per_atom) < 0.5
    assert summary.ms_per_step > 0
    frames = read(tmp_path / "md.traj", ":")
    assert len(frames) == 5  # steps 0, 5, ..., 20
    last = frames[-1]
    expected = with_ase_morse(last)
    assert last.get_potential_energy() == pytest.approx(expected.get_potential_energy(), rel=1e-10)
    assert len((tmp_path / "md.log").read_text().splitlines()) == 6  # header + 5 rows
    first = with_ase_morse(frames[0])
    drift = (expected.get_total_energy() - first.get_total_energy()) / len(first)
    assert summary.energy_drift_mev_per_atom == pytest.approx(drift * 1e3, rel=1e-8, abs=1e-9)


@pytest.mark.parametrize("ensemble", [e for e in ENSEMBLES if e != "nve"])
def test_thermostatted_ensembles_run_on_the_model_s_forces(ensemble, tmp_path):
    """The frames carry ASE's Morse energy and forces at their geometry (and cell, for
    NPT), and the summary's final temperature is that of the last frame's momenta."""
    summary = run_md(default_structure(), morse(), steps=5, ensemble=ensemble, interval=5,
                     trajectory=tmp_path / "md.traj", progress=False)
    assert summary.steps == 5
    last = read(tmp_path / "md.traj", -1)
    expected = with_ase_morse(last)
    assert last.get_potential_energy() == pytest.approx(expected.get_potential_energy(), rel=1e-10)
    assert last.get_forces() == pytest.approx(expected.get_forces(), abs=1e-8)
    assert summary.final_temperature_K == pytest.approx(expected.get_temperature(), rel=1e-10)


def test_unknown_ensemble_is_refused():
    with pytest.raises(ValueError, match="unknown ensemble 'nph'"):
        run_md(default_structure(), morse(), steps=1, ensemble="nph", progress=False)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(steps=0), "steps must be at least 1, got 0"),
        (dict(timestep_fs=0.0), "the timestep must be positive, got 0 fs"),
        (dict(timestep_fs=-1.0), "the timestep must be positive, got -1 fs"),
        (dict(temperature_K=-5.0), "the temperature must not be negative, got -5 K"),
        (dict(trajectory="md.pdb"), r"cannot write an MD trajectory .* to 'md.pdb': use .traj"),
        (dict(trajectory="nowhere/md.xyz"), "no folder 'nowhere' for the trajectory"),
        (dict(log="nowhere/md.log"), "no folder 'nowhere' for the log 'nowhere/md.log'"),
    ],
)
def test_a_run_that_cannot_mean_anything_is_refused_before_it_starts(options, message):
    with pytest.raises(MDSetupError, match=message):
        run_md(default_structure(2), morse(), **{"steps": 1, **options}, progress=False)


def test_npt_is_refused_for_a_system_that_is_not_periodic():
    cluster = default_structure(2)
    cluster.pbc = False
    with pytest.raises(MDSetupError, match="npt needs a system periodic along all three axes"):
        run_md(cluster, morse(), steps=1, ensemble="npt", progress=False)


def test_xyz_trajectories_are_extended_xyz_with_energies_and_forces(tmp_path):
    run_md(default_structure(2), morse(), steps=4, trajectory=tmp_path / "md.xyz", interval=2,
           progress=False)
    frames = read(tmp_path / "md.xyz", ":", format="extxyz")
    assert len(frames) == 3  # steps 0, 2, 4
    expected = with_ase_morse(frames[-1])
    assert frames[-1].get_potential_energy() == pytest.approx(expected.get_potential_energy(),
                                                              rel=1e-10)
    assert frames[-1].get_forces() == pytest.approx(expected.get_forces(), abs=1e-6)  # 8 decimals


def test_the_nve_summary_reports_drift_and_that_the_temperature_settles_near_half():
    summary = run_md(default_structure(2), morse(), steps=2, temperature_K=300, progress=False)
    assert summary.energy_drift_mev_per_atom is not None
    assert "total-energy drift" in str(summary)
    assert "settles near T/2 = 150 K (equipartition" in str(summary)


@pytest.mark.parametrize("ensemble", ["langevin", "nvt"])
def test_thermostatted_summaries_report_no_drift_and_name_the_thermostat(ensemble):
    summary = run_md(default_structure(2), morse(), steps=2, ensemble=ensemble, progress=False)
    assert summary.energy_drift_mev_per_atom is None
    assert "drift" not in str(summary) and "(thermostat at 300 K)" in str(summary)


def test_the_npt_summary_reports_mean_volume_and_pressure(tmp_path):
    """Means over the steps, 0 included, of the volume and of the pressure with its ideal-gas
    part (ASE's Morse stress and the momenta of each recorded frame)."""
    atoms = default_structure(2)
    summary = run_md(atoms, morse(), steps=2, ensemble="npt", interval=1,
                     trajectory=tmp_path / "md.traj", progress=False)
    frames = [with_ase_morse(frame) for frame in read(tmp_path / "md.traj", ":")]
    assert len(frames) == 3
    volumes = [frame.get_volume() for frame in frames]
    pressures = [-frame.get_stress(include_ideal_gas=True)[:3].mean() / units.GPa
                 for frame in frames]
    assert summary.mean_volume_A3 == pytest.approx(sum(volumes) / 3, rel=1e-10)
    assert summary.mean_pressure_GPa == pytest.approx(sum(pressures) / 3, rel=1e-8)
    printed = str(summary)
    assert "drift" not in printed
    assert f"volume {summary.mean_volume_A3:.1f} A^3 mean" in printed
    assert f"pressure {summary.mean_pressure_GPa:+.2f} GPa mean (barostat at 0 GPa)" in printed


def test_into_a_log_file_the_progress_bar_is_drawn_at_its_start_and_end(monkeypatch):
    log = io.StringIO()  # standard error of a batch job
    monkeypatch.setattr(sys, "stderr", log)
    run_md(default_structure(), morse(), steps=20)
    draws = log.getvalue().split("\r")[1:]
    assert len(draws) == 2 and draws[-1].startswith("100%|")
    assert "ms/step" in draws[-1]
