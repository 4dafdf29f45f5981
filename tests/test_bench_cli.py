"""`fastcalc bench` times fastcalc against the upstream calculator on the same random
model and writes JSON records and a plot into a new folder unless told where; it
refuses to time models that disagree."""

import datetime
import json
import sys
from pathlib import Path

import pytest
import torch
from pair_potential import CUTOFF, ase_morse, morse_energy

from fastcalc import PotentialCalculator, cli
from fastcalc.bench import copper
from fastcalc.bench.suite import check_agreement
from fastcalc.bench.upstream import (
    build_checkpoint,
    default_backbone,
    export_pet,
    fairchem_preset_calculator,
)
from fastcalc.cli import default_out, main

RECORD_KEYS = {"date", "gpu", "torch", "model", "natoms", "impl", "median_ms", "p90_ms",
               "force_rel_err", "warmup_s", "peak_mem_gib", "recompiles"}
THROUGHPUT_KEYS = {"date", "gpu", "torch", "model", "impl", "structure_set", "structures",
                   "atoms", "structures_per_s", "pass_s", "first_pass_s", "recompiles",
                   "energy_err_ev", "force_err_ev_a", "force_rel_err", "error"}
STREAM_KEYS = {"date", "gpu", "torch", "model", "impl", "structures", "calls", "total_s",
               "first_result_s", "call_s"}
NEW = Path("fastcalc-bench-new")


@pytest.fixture
def runs(monkeypatch) -> list:
    """The (workload, model or models, options) of each benchmark the command would run;
    the new folder for the records is ``NEW``."""
    runs = []
    monkeypatch.setattr(cli, "run_benchmark",
                        lambda name, **options: runs.append(("sizes", name, options)))
    monkeypatch.setattr(cli, "run_stream",
                        lambda names, **options: runs.append(("stream", names, options)))
    monkeypatch.setattr(cli, "run_throughput",
                        lambda names, **options: runs.append(("throughput", names, options)))
    monkeypatch.setattr(cli, "default_out", lambda now: NEW)
    return runs


def test_the_records_go_to_a_new_folder_named_by_the_time():
    now = datetime.datetime(2026, 11, 30, 14, 5, 9)
    assert default_out(now) == Path("fastcalc-bench-2026-11-30-140509")


def test_bench_runs_both_models_at_64_108_and_1008_atoms_into_a_new_folder_by_default(
    runs, capsys
):
    main(["bench", "--device", "cpu"])
    defaults = dict(device="cpu", sizes=[64, 108, 1008], calls=20, warmup=3,
                    out=NEW, small=False, contenders=None)
    assert runs == [("sizes", "pet", defaults), ("sizes", "uma", defaults)]
    assert "writing into fastcalc-bench-new" in capsys.readouterr().out


def test_small_runs_3_calls_on_32_atoms_unless_told_otherwise(runs):
    main(["bench", "uma", "--small", "--device", "cpu", "--contenders", "fairchem", "fastcalc"])
    main(["bench", "pet", "--small", "--device", "cpu", "--sizes", "256", "32", "--warmup", "0",
          "--out", "benchmarks/results"])
    assert runs == [
        ("sizes", "uma", dict(device="cpu", sizes=[32], calls=3, warmup=2,
                              out=NEW, small=True, contenders=["fairchem", "fastcalc"])),
        ("sizes", "pet", dict(device="cpu", sizes=[256, 32], calls=3, warmup=0,
                              out=Path("benchmarks/results"), small=True, contenders=None)),
    ]


def test_the_stream_workload_runs_10_calls_per_structure_or_2_when_small(runs):
    main(["bench", "--workload", "stream", "--device", "cpu", "--out", "here"])
    main(["bench", "pet", "--workload", "stream", "--small", "--device", "cpu"])
    main(["bench", "uma", "--workload", "stream", "--calls", "4", "--device", "cpu"])
    assert runs == [
        ("stream", ["pet", "uma"], dict(device="cpu", calls=10, out=Path("here"), small=False)),
        ("stream", ["pet"], dict(device="cpu", calls=2, out=NEW, small=True)),
        ("stream", ["uma"], dict(device="cpu", calls=4, out=NEW, small=False)),
    ]


def test_the_throughput_workload_runs_3_passes_per_set_or_1_when_small(runs):
    main(["bench", "--workload", "throughput", "--device", "cpu", "--out", "here"])
    main(["bench", "uma", "--workload", "throughput", "--small", "--device", "cpu"])
    main(["bench", "pet", "--workload", "throughput", "--calls", "5", "--device", "cpu",
          "--contenders", "metatomic-batched"])
    assert runs == [
        ("throughput", ["pet", "uma"], dict(device="cpu", passes=3, out=Path("here"),
                                            small=False, contenders=None)),
        ("throughput", ["uma"], dict(device="cpu", passes=1, out=NEW, small=True,
                                     contenders=None)),
        ("throughput", ["pet"], dict(device="cpu", passes=5, out=NEW, small=False,
                                     contenders=["metatomic-batched"])),
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes", "64", "100"], "invalid choice: 100 (choose from 32, 64, 108, 256, 1008)"),
        (["mace"], "invalid choice: 'mace'"),
        (["--calls", "0"], "--calls: must be at least 1"),
        (["--device", "tpu"], "invalid choice: 'tpu'"),
        (["--workload", "md"], "invalid choice: 'md'"),
    ],
)
def test_bench_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unknown_contender_is_one_line_naming_the_choices_and_leaves_no_folder(
    tmp_path, capsys
):
    out = tmp_path / "records"
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "uma", "--small", "--device", "cpu", "--out", str(out),
              "--contenders", "fastcalc", "mace"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "no contender mace here; choose from fairchem, fairchem-general" in err
    assert len(err.splitlines()) == 1
    assert not out.exists()


def test_throughput_of_one_contender_times_it_alone(tmp_path, capsys):
    """One implementation per process: each may have the GPU's memory to itself."""
    main(["bench", "pet", "--workload", "throughput", "--small", "--device", "cpu",
          "--out", str(tmp_path), "--contenders", "metatomic-batched"])
    rows = json.loads((tmp_path / "throughput.json").read_text())
    assert [row["impl"] for row in rows] == ["metatomic-batched"] * 2
    assert all(row["structures_per_s"] > 0 and row["force_rel_err"] < 1e-4 for row in rows)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "pet", "--workload", "throughput", "--small", "--device", "cpu",
              "--out", str(tmp_path), "--contenders", "fairchem-batched"])
    assert exit_info.value.code == 2
    assert ("no contender fairchem-batched here; choose from fastcalc, fastcalc-many, "
            "metatomic-batched") in capsys.readouterr().err


def test_first_result_names_its_choices_for_an_unknown_contender(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "pet", "--workload", "first-result", "--small", "--device", "cpu",
              "--out", str(tmp_path), "--contenders", "mace"])
    assert exit_info.value.code == 2
    assert "no contender mace here; choose from fastcalc, metatomic" in capsys.readouterr().err


def small_bench(model: str, folder, capsys) -> tuple[list[dict], str]:
    """Run ``fastcalc bench MODEL --small --device cpu --out FOLDER``; check the records and
    the plot that every model's run writes and return the records and the printed text."""
    main(["bench", model, "--small", "--device", "cpu", "--out", str(folder)])
    rows = json.loads((folder / f"{model}.json").read_text())
    for row in rows:
        assert set(row) == RECORD_KEYS
        assert (row["natoms"], row["gpu"]) == (32, "cpu")
        assert 0 < row["median_ms"] <= row["p90_ms"] and row["warmup_s"] > 0
        assert row["recompiles"] == 0
        assert row["force_rel_err"] < 1e-4  # float32 against float64, same model
    assert (folder / f"{model}.png").read_bytes()[:4] == b"\x89PNG"
    return rows, capsys.readouterr().out


@pytest.fixture
def compile_nothing(monkeypatch):
    """``torch.compile`` returns its input. Compiling the tiny models costs minutes on CPU
    (fastcalc's, and fairchem's on the UMA side) and is not what these tests are about;
    the PET and UMA compile tests cover fastcalc's."""
    monkeypatch.setattr(torch, "compile", lambda model, **options: model)


@pytest.mark.usefixtures("compile_nothing")
def test_small_pet_bench_times_fastcalc_and_metatomic_on_a_tiny_pet(tmp_path, capsys):
    rows, printed = small_bench("pet", tmp_path, capsys)
    assert [(row["impl"], row["model"]) for row in rows] == [
        ("metatomic", "pet-tiny-random"), ("fastcalc-tf32", "pet-tiny-random"),
        ("fastcalc", "pet-tiny-random"),
    ]
    assert "eager fastcalc against metatomic (float32, 32 atoms)" in printed
    assert "| atoms | metatomic ms | fastcalc ms | ratio |" in printed


@pytest.mark.usefixtures("compile_nothing")
def test_small_uma_bench_times_fastcalc_and_fairchem_on_a_tiny_uma(tmp_path, capsys):
    rows, printed = small_bench("uma", tmp_path, capsys)
    assert [(row["impl"], row["model"]) for row in rows] == [
        ("fairchem", "uma-tiny-random"), ("fairchem-general", "uma-tiny-random"),
        ("fairchem-tf32", "uma-tiny-random"), ("fastcalc-tf32", "uma-tiny-random"),
        ("fastcalc-3xtf32", "uma-tiny-random"), ("fastcalc", "uma-tiny-random"),
    ]
    assert "eager fastcalc against fairchem (float32, 32 atoms)" in printed
    assert "| atoms | fairchem ms | fastcalc ms | ratio |" in printed
    assert "| atoms | fairchem-general ms | fastcalc ms | ratio |" in printed
    assert "| atoms | fairchem-tf32 ms | fastcalc-tf32 ms | ratio |" in printed
    assert "| atoms | fairchem ms | fastcalc-3xtf32 ms | ratio |" in printed


def test_the_fairchem_reference_is_the_high_precision_preset_with_fairchems_backend(tmp_path):
    from fairchem.core.units.mlip_unit.api.inference import guess_inference_settings

    path = build_checkpoint(tmp_path / "uma.pt", default_backbone(), "UMA-S-1.2", seed=0).path
    preset = guess_inference_settings("high-precision")
    assert preset.execution_mode is None and not preset.tf32 and preset.merge_mole
    used = fairchem_preset_calculator(path, "omat", "cpu").predictor.inference_settings
    assert used == preset  # on the CPU fairchem keeps the general backend, unnamed
    general = fairchem_preset_calculator(path, "omat", "cpu", execution_mode="general")
    assert general.predictor.inference_settings.execution_mode == "general"


@pytest.mark.usefixtures("compile_nothing")
def test_small_stream_times_both_models_over_three_structures(tmp_path, capsys):
    main(["bench", "--workload", "stream", "--small", "--device", "cpu", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "stream.json").read_text())
    assert [(row["model"], row["impl"]) for row in rows] == [
        ("pet-tiny-random", "metatomic"), ("pet-tiny-random", "fastcalc"),
        ("uma-tiny-random", "fairchem"), ("uma-tiny-random", "fastcalc"),
    ]
    for row in rows:
        assert set(row) == STREAM_KEYS and (row["structures"], row["calls"]) == (3, 6)
        assert 0 < row["first_result_s"] < row["total_s"]
    assert (tmp_path / "stream.png").read_bytes()[:4] == b"\x89PNG"
    assert "on 3 structures, largest force difference" in capsys.readouterr().out


@pytest.mark.usefixtures("compile_nothing")
def test_small_throughput_times_both_models_one_at_a_time_and_batched(tmp_path, capsys):
    main(["bench", "--workload", "throughput", "--small", "--device", "cpu",
          "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "throughput.json").read_text())
    sets = ["fcc Cu 32 atoms x 3", "mixed 12-32 atoms x 3"]
    assert [(row["model"], row["structure_set"], row["impl"]) for row in rows] == [
        (model, structure_set, impl)
        for model, upstream in (("pet-tiny-random", "metatomic"), ("uma-tiny-random", "fairchem"))
        for structure_set in sets
        for impl in ("fastcalc", "fastcalc-many", f"{upstream}-batched", "fastcalc-tf32",
                     "fastcalc-tf32-many", f"{upstream}-tf32-batched")
    ]
    for row in rows:
        assert set(row) == THROUGHPUT_KEYS and row["structures"] == 3 and len(row["pass_s"]) == 1
        assert row["structures_per_s"] > 0 and row["first_pass_s"] > 0
        assert row["recompiles"] == 0
        # float32 against float64 fastcalc, same model (the upstream's batched path too;
        # TF32 exists only on CUDA)
        assert row["energy_err_ev"] < 1e-3 and row["force_rel_err"] < 1e-4
    assert (tmp_path / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "| model | structures | impl | structures/s | first pass s | max dE eV |" in printed


def test_the_agreement_check_passes_one_model_and_refuses_another():
    atoms = copper(32)
    ours = PotentialCalculator(morse_energy, CUTOFF, device="cpu", dtype="float64")
    agreement = check_agreement(ase_morse(), ours, atoms)
    assert max(agreement.energy, agreement.forces, agreement.stress) < 1e-10
    other = ase_morse()
    other.set(epsilon=1.01 * other.parameters.epsilon)
    with pytest.raises(RuntimeError, match="disagree on 32 atoms"):
        check_agreement(other, ours, atoms)


@pytest.mark.parametrize(
    "build, module, package",
    [
        (lambda path: export_pet({}, path), "metatrain", "metatrain"),
        (lambda path: build_checkpoint(path, default_backbone(), "UMA-S-1.2", seed=0),
         "fairchem", "fairchem-core"),
    ],
)
def test_a_missing_upstream_package_is_named(build, module, package, tmp_path, monkeypatch):
    for name in [module, *(name for name in sys.modules if name.startswith(f"{module}."))]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now fails
    with pytest.raises(ModuleNotFoundError, match=f"pip install {package}"):
        build(tmp_path / "model.pt")


def test_first_result_runs_fresh_processes_with_caches_cold_and_warm(tmp_path, capsys):
    """On CPU fastcalc runs eagerly, so this checks the machinery: four fresh processes,
    their records and the table."""
    main(["bench", "pet", "--workload", "first-result", "--small", "--device", "cpu",
          "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "first_result.json").read_text())
    assert [(row["impl"], row["cache"]) for row in rows] == [
        ("fastcalc", "cold"), ("fastcalc", "warm"), ("metatomic", "cold"), ("metatomic", "warm")
    ]
    for row in rows:
        assert (row["model"], row["natoms"], row["gpu"]) == ("pet-tiny-random", 32, "cpu")
        assert 0 < row["first_result_s"] < 600
        phases = row["import_s"] + row["build_s"] + row["call_s"]
        assert min(row["import_s"], row["build_s"], row["call_s"]) > 0
        assert row["first_result_s"] == pytest.approx(phases)
        if row["impl"] == "fastcalc":  # then once more, as it runs from then on
            assert row["compiled_s"] > row["first_result_s"]
        else:
            assert row["compiled_s"] is None
    assert ("| compile caches | first result s | imports s | build s | first call s "
            "| compiled result s |") in capsys.readouterr().out
