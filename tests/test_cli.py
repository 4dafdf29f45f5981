"""`fastcalc md` runs the bundled demo models out of the box."""

import pytest
from ase.io import read

from fastcalc.cli import main
from fastcalc.md import default_structure, run_md
from fastcalc.models import load_calculator


def test_md_command_writes_a_trajectory_with_energies_and_forces(tmp_path, capsys):
    main(["md", "--steps", "4", "--device", "cpu", "--output", str(tmp_path / "md.traj"),
          "--log", str(tmp_path / "md.log")])
    printed = capsys.readouterr().out
    assert "model pet-demo-cu on cpu" in printed and "4 steps of 108 atoms" in printed
    frames = read(tmp_path / "md.traj", ":")
    assert len(frames) == 1  # every 10th step, and the start
    assert frames[0].get_forces().shape == (108, 3)


def test_md_command_reads_a_structure_and_runs_the_uma_demo(tmp_path, capsys):
    atoms = default_structure()[:32]
    atoms.write(tmp_path / "start.xyz")
    main(["md", str(tmp_path / "start.xyz"), "--model", "uma-demo-cu", "--steps", "2",
          "--device", "cpu", "--ensemble", "langevin"])
    assert "2 steps of 32 atoms" in capsys.readouterr().out


def test_an_unknown_model_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="bundled models: pet-demo-cu, uma-demo-cu"):
        main(["md", "--model", "missing.pt", "--steps", "1", "--device", "cpu"])


def test_pet_demo_conserves_energy_over_200_nve_steps():
    summary = run_md(default_structure(), load_calculator("pet-demo-cu", device="cpu"),
                     steps=200, timestep_fs=2.0, temperature_K=300, progress=False)
    assert abs(summary.energy_drift_mev_per_atom) < 2.0
