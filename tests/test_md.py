"""fastcalc.md.run_md drives ASE's integrators and reports what happened."""

import pytest
from ase.io import read
from pair_potential import CUTOFF, ase_morse, morse_energy

from fastcalc import PotentialCalculator
from fastcalc.md import ENSEMBLES, default_structure, run_md


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
    expected = last.copy()
    expected.calc = ase_morse()
    assert last.get_potential_energy() == pytest.approx(expected.get_potential_energy(), rel=1e-10)
    assert len((tmp_path / "md.log").read_text().splitlines()) == 6  # header + 5 rows


@pytest.mark.parametrize("ensemble", [e for e in ENSEMBLES if e != "nve"])
def test_thermostatted_ensembles_run(ensemble):
    summary = run_md(default_structure(), morse(), steps=5, ensemble=ensemble, progress=False)
    assert summary.steps == 5 and summary.final_temperature_K > 0


def test_unknown_ensemble_is_refused():
    with pytest.raises(ValueError, match="unknown ensemble 'nph'"):
        run_md(default_structure(), morse(), steps=1, ensemble="nph", progress=False)
