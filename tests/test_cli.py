"""`fastcalc md` runs the bundled demo models out of the box. A user's mistake is one line
on stderr and exit status 2 (with `--debug`, its traceback); a bug keeps its traceback."""

import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.io import Trajectory, read, write

from fastcalc import InvalidAtomsError, cli
from fastcalc.cli import main
from fastcalc.md import default_structure, run_md
from fastcalc.models import load_calculator


def refused(capsys, argv) -> str:
    """Run ``fastcalc ARGV``; check that it exits with status 2 and one line on stderr,
    without a traceback, and return that line."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err.strip()


def structure_file(folder, atoms=None, name="start.xyz") -> str:
    """``atoms`` (default: 32 atoms of fcc copper) written to ``folder / name``."""
    path = folder / name
    (default_structure(2) if atoms is None else atoms).write(path)
    return str(path)


def gold(folder) -> str:
    return structure_file(folder, bulk("Au", cubic=True))


def empty_file(folder) -> str:
    (folder / "empty.xyz").write_text("")
    return str(folder / "empty.xyz")


def no_atoms(folder) -> str:
    (folder / "none.xyz").write_text("0\n\n")
    return str(folder / "none.xyz")


def cluster(folder) -> str:
    atoms = default_structure(2)
    atoms.pbc = False
    return structure_file(folder, atoms)


@pytest.mark.parametrize(
    "argv, message",
    [
        (lambda d: [str(d / "nowhere.xyz")], "fastcalc md: error: no structure file '"),
        (lambda d: [empty_file(d)], "cannot read a structure from '"),
        (lambda d: [no_atoms(d)], "has no atoms"),
        (lambda d: ["--model", str(d / "missing.pt")], "no model file '"),
        (lambda d: ["--model", str(d)], "is a folder, not a model file"),
        (lambda d: ["--model", "pet-demo-c"], "no model file 'pet-demo-c' (did you mean "
                                              "'pet-demo-cu'?); bundled models: pet-demo-cu"),
        (lambda d: [gold(d), "--steps", "1"], "the model does not support Au; it supports Cu"),
        (lambda d: [cluster(d), "--ensemble", "npt"], "npt needs a system periodic"),
        (lambda d: ["--model", "uma-demo-cu", "--task", "omcat"], "unknown task 'omcat'"),
        (lambda d: ["--task", "omat"], "PET models have no tasks, got task 'omat'"),
        (lambda d: ["--steps", "0"], "steps must be at least 1, got 0"),
        (lambda d: ["--steps", "-3"], "steps must be at least 1, got -3"),
        (lambda d: ["--timestep", "0"], "the timestep must be positive, got 0 fs"),
        (lambda d: ["--timestep", "-1"], "the timestep must be positive, got -1 fs"),
        (lambda d: ["--temperature", "-1"], "the temperature must not be negative, got -1 K"),
        (lambda d: ["--output", str(d / "md.pdb")], "use .traj, .xyz, .extxyz"),
        (lambda d: ["--output", str(d / "md.foo")], "use .traj, .xyz, .extxyz"),
        (lambda d: ["--steps", "many"], "argument --steps: invalid int value: 'many'"),
        (lambda d: ["--output", str(d / "nowhere" / "md.xyz")], "no folder '"),
        (lambda d: ["--log", str(d / "nowhere" / "md.log")], "no folder '"),
        (lambda d: [structure_file(d, name="run.xyz"), "--output", str(d / "run.xyz")],
         "is the input structure; write it elsewhere"),
    ],
    ids=["missing structure", "empty structure file", "structure without atoms",
         "missing model file", "model folder", "misspelt model", "element the model lacks",
         "npt without periodicity", "unknown uma task", "task for pet", "zero steps",
         "negative steps", "zero timestep", "negative timestep", "negative temperature",
         "pdb output", "unknown output suffix", "steps not a number",
         "output in a missing folder", "log in a missing folder", "output is the input"],
)
def test_a_mistake_is_one_line_and_exit_status_2(argv, message, tmp_path, capsys):
    line = refused(capsys, ["md", *argv(tmp_path), "--small", "--device", "cpu"])
    assert message in line


@pytest.mark.parametrize("command", ["md", "bench"])
def test_cuda_asked_for_where_there_is_none_is_a_mistake(command, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = refused(capsys, [command, "--device", "cuda"])
    assert f"fastcalc {command}: error: --device cuda: CUDA is not available here" in line


def test_debug_shows_the_traceback_of_a_mistake(tmp_path):
    with pytest.raises(InvalidAtomsError, match="does not support Au"):
        main(["md", gold(tmp_path), "--device", "cpu", "--debug"])


def test_a_bug_keeps_its_traceback(monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "load_calculator", broken)
    with pytest.raises(ZeroDivisionError, match="a bug"):
        main(["md", "--device", "cpu"])


def assert_metatomic_numbers(frame) -> None:
    """The energy and forces recorded in ``frame`` are metatomic's calculator's on the same
    weights (the demo model, pet-demo-cu) at the frame's geometry."""
    from fastcalc.bench.upstream import metatomic_calculator
    from fastcalc.demo_models import PET_DEMO_CU

    upstream = frame.copy()
    upstream.calc = metatomic_calculator(PET_DEMO_CU, "cpu")
    expected = upstream.get_forces()
    assert frame.get_potential_energy() == pytest.approx(upstream.get_potential_energy(),
                                                         abs=1e-4)  # float32 round-off
    np.testing.assert_allclose(frame.get_forces(), expected, rtol=0,
                               atol=1e-4 * max(1.0, abs(expected).max()))


def test_md_command_writes_a_trajectory_with_energies_and_forces(tmp_path, capsys):
    main(["md", "--steps", "4", "--device", "cpu", "--output", str(tmp_path / "md.traj"),
          "--log", str(tmp_path / "md.log")])
    printed = capsys.readouterr().out
    assert "model pet-demo-cu on cpu" in printed and "4 steps of 108 atoms" in printed
    frames = read(tmp_path / "md.traj", ":")
    assert len(frames) == 1  # every 10th step, and the start
    assert_metatomic_numbers(frames[0])


def test_an_xyz_output_is_extended_xyz_with_energies_and_forces(tmp_path):
    main(["md", "--small", "--steps", "10", "--device", "cpu",
          "--output", str(tmp_path / "md.xyz")])
    frames = read(tmp_path / "md.xyz", ":", format="extxyz")
    assert len(frames) == 2  # steps 0 and 10
    assert_metatomic_numbers(frames[-1])


def test_small_runs_20_nve_steps_of_32_atoms_and_explains_the_temperature(capsys):
    main(["md", "--small", "--device", "cpu"])
    printed = capsys.readouterr().out
    assert "20 steps of 32 atoms (nve)" in printed
    assert "total-energy drift" in printed and "settles near T/2 = 150 K" in printed


def test_threads_sets_torchs_cpu_threads(monkeypatch):
    asked = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    main(["md", "--small", "--steps", "1", "--device", "cpu", "--threads", "1"])
    assert asked == [1]


def test_md_command_reads_a_structure_and_runs_the_uma_demo(tmp_path, capsys):
    main(["md", structure_file(tmp_path), "--model", "uma-demo-cu", "--steps", "2",
          "--device", "cpu", "--ensemble", "langevin"])
    assert "2 steps of 32 atoms" in capsys.readouterr().out


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"fastcalc {metadata.version('fastcalc')}\n"


@pytest.mark.parametrize(
    "command, default",
    [("md", "MD timestep in fs (default: 2.0)"), ("md", "(default: pet-demo-cu)"),
     ("bench", "(default: sizes)")],
)
def test_help_shows_the_defaults(command, default, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert default in " ".join(capsys.readouterr().out.split())


def test_help_prints_no_warp_cuda_warning():
    done = subprocess.run([sys.executable, "-m", "fastcalc", "--help"], capture_output=True,
                          text=True, check=True)
    assert "usage: fastcalc" in done.stdout
    assert "Warp" not in done.stderr


def test_pet_demo_conserves_energy_over_200_nve_steps():
    summary = run_md(default_structure(), load_calculator("pet-demo-cu", device="cpu"),
                     steps=200, timestep_fs=2.0, temperature_K=300, progress=False)
    assert abs(summary.energy_drift_mev_per_atom) < 2.0


def test_compile_fills_the_cache_that_a_later_calculator_starts_from(tmp_path, capsys):
    """``fastcalc compile --batched`` stores the model's functions for one structure and
    for batches, and its conversion from the file; ``cache list`` shows them, a calculator
    built later loads both functions from the cache, and ``cache clear`` removes them."""
    from fastcalc import CompiledPETCalculator

    main(["compile", "pet-demo-cu", "--device", "cpu", "--batched", "--cache-dir",
          str(tmp_path)])
    out = capsys.readouterr().out
    assert "one structure: compiled and stored" in out and "batches: compiled and stored" in out
    main(["cache", "list", "--cache-dir", str(tmp_path)])
    listed = capsys.readouterr().out
    assert listed.startswith("2 compiled models in") and "dtype float32" in listed
    assert "graph single" in listed and "graph batch" in listed
    assert "1 models converted from their files" in listed
    from metatomic_ase import MetatomicCalculator

    from fastcalc.demo_models import PET_DEMO_CU

    calculator = CompiledPETCalculator(
        "pet-demo-cu", device="cpu", compile_mode="default", cache_dir=tmp_path,
        compile_in_background=False,
    )
    atoms = bulk("Cu", cubic=True).repeat(2)
    atoms.rattle(0.05, seed=3)
    upstream = atoms.copy()
    upstream.calc = MetatomicCalculator(str(PET_DEMO_CU), device="cpu")
    expected = upstream.get_forces()
    atoms.calc = calculator
    (result,) = calculator.evaluate_many([atoms])
    for forces in (result["forces"], atoms.get_forces()):  # both loaded functions
        np.testing.assert_allclose(forces, expected, rtol=0, atol=1e-4 * abs(expected).max())
    assert calculator.compile_stats["from_cache"] == 1
    assert calculator.batch_compile_stats["from_cache"] == 1
    main(["cache", "clear", "--cache-dir", str(tmp_path)])
    assert "removed 3 files (compiled and converted models" in capsys.readouterr().out


def test_cache_list_names_an_unreadable_entry(tmp_path, capsys):
    (tmp_path / f"{'0' * 32}.fastcalc-compiled").write_bytes(b"not a compiled model")
    main(["cache", "list", "--cache-dir", str(tmp_path)])
    listed = capsys.readouterr().out
    assert listed.startswith("1 compiled models in")
    assert "unreadable (its model's next load replaces it)" in listed


def screen_input(folder) -> str:
    """Two copper structures and a gold one, in one extended XYZ file."""
    path = folder / "many.xyz"
    small = bulk("Cu", cubic=True, a=3.61)
    small.rattle(0.05, seed=1)
    write(path, [default_structure(2), bulk("Au", cubic=True), small], format="extxyz")
    return str(path)


def test_screen_command_writes_every_structure_with_its_index(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["screen", screen_input(tmp_path), "--device", "cpu"])
    printed = capsys.readouterr().out
    assert "into many-screen.extxyz" in printed
    assert "2 done, 1 failed, 0 skipped (already in the output)" in printed
    frames = read(tmp_path / "many-screen.extxyz", ":", format="extxyz")
    assert sorted(frame.info["screen_index"] for frame in frames) == [0, 1, 2]
    failed = [frame for frame in frames if "screen_error" in frame.info]
    assert [frame.info["screen_index"] for frame in failed] == [1]
    assert "does not support Au" in failed[0].info["screen_error"]


def test_a_screen_resumed_with_another_model_is_refused_naming_both(tmp_path, capsys):
    out = tmp_path / "out.extxyz"
    main(["screen", screen_input(tmp_path), "--device", "cpu", "--out", str(out)])
    assert {(frame.info["screen_model"], frame.info["screen_dtype"])
            for frame in read(out, ":", format="extxyz")} == {("pet-demo-cu", "float32")}
    capsys.readouterr()
    written = out.read_bytes()
    line = refused(capsys, ["screen", screen_input(tmp_path), "--device", "cpu", "--out",
                            str(out), "--resume", "--model", "uma-demo-cu"])
    assert "made with other settings (model pet-demo-cu in the file, uma-demo-cu now)" in line
    assert out.read_bytes() == written


def test_screen_builds_its_calculator_with_the_precision_asked_for(tmp_path, monkeypatch):
    built = []

    def recording(*args, **kwargs):
        built.append(load_calculator(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(cli, "load_calculator", recording)
    main(["screen", screen_input(tmp_path), "--device", "cpu", "--precision", "3xtf32",
          "--out", str(tmp_path / "out.extxyz")])
    assert [calc.precision for calc in built] == ["3xtf32"]


@pytest.mark.parametrize("command", [["md", "--small"], ["screen", "in.xyz"],
                                     ["compile", "pet-demo-cu"]])
def test_a_reduced_precision_of_float64_is_one_line_and_exit_status_2(command, capsys):
    line = refused(capsys, [*command, "--device", "cpu", "--dtype", "float64",
                            "--precision", "tf32"])
    assert f"fastcalc {command[0]}: error: --precision tf32 applies to --dtype float32" in line


def empty_trajectory(folder) -> str:
    Trajectory(folder / "empty.traj", "w").close()
    return str(folder / "empty.traj")


@pytest.mark.parametrize(
    "argv, message",
    [
        (lambda d: [str(d / "nowhere.xyz")], "fastcalc screen: error: no structure file '"),
        (lambda d: [empty_file(d)], "cannot read structure 0 from '"),
        (lambda d: [empty_trajectory(d)], "no structures in '"),
        (lambda d: [screen_input(d), "--out", str(d / "out.traj")], "use .extxyz or .xyz"),
        (lambda d: [screen_input(d), "--out", str(d / "many.xyz")], "is the input file"),
        (lambda d: [screen_input(d), "--out", structure_file(d, name="done.xyz")],
         "done.xyz' already exists: resume"),
        (lambda d: [screen_input(d), "--relax", "--fmax", "0"], "fmax must be positive"),
        (lambda d: [screen_input(d), "--max-steps", "0"], "must be at least 1, got 0"),
    ],
    ids=["missing input", "empty input", "trajectory without frames", "traj output", "output is the input",
         "existing output", "zero fmax", "zero max steps"],
)
def test_a_screen_mistake_is_one_line_and_exit_status_2(argv, message, tmp_path, capsys):
    line = refused(capsys, ["screen", *argv(tmp_path), "--device", "cpu"])
    assert message in line


def test_screen_workers_without_ray_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    line = refused(capsys, ["screen", screen_input(tmp_path), "--workers", "2",
                            "--out", str(tmp_path / "out.extxyz")])
    assert "pip install 'fastcalc[ray]'" in line


def test_an_interrupted_screen_says_how_to_resume(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "screen", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        main(["screen", screen_input(tmp_path), "--device", "cpu"])
    assert exit_info.value.code == 130
    assert "run the same command with --resume" in capsys.readouterr().err
