"""The disk cache of compiled models: a second process runs what the first compiled and
stored without tracing or compiling, a damaged entry is reported and rebuilt, two
processes may fill one entry, and inputs a stored graph refuses are compiled for."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pair_potential import assert_ase_morse, crystal, graph_inputs, morse_efs
from fastcalc.compile_cache import (
    CACHE_ENV,
    CacheKey,
    CompileCache,
    default_cache_dir,
    held,
    locked,
    tensors_digest,
)
from fastcalc.saved_graph import SavedGraph
from fastcalc.tracing import GraphRunner

WORKER = Path(__file__).with_name("compile_cache_worker.py")


def start(cache: Path, inductor: Path) -> subprocess.Popen:
    """A worker process with its own, empty, torch compile cache: only fastcalc's disk
    cache can carry compiled code from one process to the next."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(cache)], cwd=WORKER.parent, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(process: subprocess.Popen) -> tuple[dict, str]:
    out, err = process.communicate(timeout=900)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def run(cache: Path, inductor: Path) -> tuple[dict, str]:
    return finish(start(cache, inductor))


def assert_morse_numbers(result: dict) -> None:
    """``result`` (a worker's: energy, forces, stress) equals ASE's Morse calculator's on
    the crystal the workers evaluate."""
    assert_ase_morse(result["energy"], result["forces"], result["stress"], crystal((2, 2, 2)))


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    """A cache folder holding the entry a first process stored."""
    cache = tmp_path_factory.mktemp("cache")
    result, _ = run(cache, tmp_path_factory.mktemp("inductor"))
    assert result["stats"]["from_cache"] == 0
    assert result["cpp_builds"] > 0  # inductor's C++ kernels, built into libraries
    return cache


def test_a_second_process_runs_the_stored_entry_without_compiling(stored, tmp_path):
    """Its torch compile cache is empty, as on another node: nothing is traced, compiled by
    dynamo and inductor, or built by the C++ compiler (the libraries come with the entry)."""
    (entry,) = CompileCache(stored).entries()
    assert entry.key["model"] == "morse-test" and entry.key["torch"] == torch.__version__
    result, _ = run(stored, tmp_path / "inductor")
    assert result["stats"] == {
        "compilations": 0, "cuda_graphs": 0, "recompiles": 0, "from_cache": 1, "building": 0
    }
    assert result["cpp_builds"] == 0
    assert_morse_numbers(result)


def test_loading_an_entry_logs_where_its_time_went(stored, tmp_path):
    _, err = run(stored, tmp_path / "inductor")
    assert "reading the stored model and its kernels took" in err
    (line,) = [line for line in err.splitlines() if "binding the stored model" in line]
    parts = re.findall(r"(\d+\.\d) s", line)
    assert len(parts) == 3  # the total, then torch's compile artifacts, compiled code
    total, *phases = map(float, parts)
    assert total == pytest.approx(sum(phases), abs=0.15)  # each rounded to 0.1 s
    assert "first compiled call" in err


def test_a_damaged_entry_is_reported_rebuilt_and_results_stay_right(stored, tmp_path):
    (entry,) = CompileCache(stored).entries()
    data = bytearray(entry.path.read_bytes())
    middle = slice(len(data) // 2, len(data) // 2 + 100)
    data[middle] = bytes(byte ^ 0xFF for byte in data[middle])  # damage what is stored
    entry.path.write_bytes(bytes(data))
    result, err = run(stored, tmp_path / "inductor")
    warnings = [line for line in err.splitlines() if "compile cache entry" in line]
    assert len(warnings) == 1 and "checksum" in warnings[0]
    assert result["stats"]["from_cache"] == 0
    assert_morse_numbers(result)
    (rebuilt,) = CompileCache(stored).entries()
    assert rebuilt.key["model"] == "morse-test"  # readable again


def test_two_processes_filling_one_entry_both_succeed(tmp_path):
    cache = tmp_path / "cache"
    processes = [start(cache, tmp_path / f"inductor-{i}") for i in range(2)]
    for process in processes:
        assert_morse_numbers(finish(process)[0])
    (entry,) = CompileCache(cache).entries()
    assert entry.key["model"] == "morse-test"
    assert not list(cache.glob("*.tmp"))


def test_an_entry_of_another_key_is_not_used(tmp_path):
    cache = CompileCache(tmp_path)
    key = CacheKey.create("a", torch.device("cpu"), torch.float64, "float32", "default")
    other = CacheKey.create("b", torch.device("cpu"), torch.float64, "float32", "default")
    assert cache.path(key) != cache.path(other)
    assert cache.load(key, None) is None  # nothing stored


def test_changed_fastcalc_source_names_another_entry(tmp_path, monkeypatch):
    """A development install edited under one version number does not load entries
    compiled from its earlier code: one changed file changes the source digest, which
    names the entry."""
    import shutil

    import fastcalc
    from fastcalc import compile_cache

    copies = []
    for name in ("same", "edited"):
        copies.append(tmp_path / name / "fastcalc")
        shutil.copytree(Path(fastcalc.__file__).parent, copies[-1],
                        ignore=shutil.ignore_patterns("__pycache__", "*.pt"))
    with open(copies[1] / "geometry.py", "a") as handle:
        handle.write("\n# edited\n")
    assert compile_cache.source_digest(copies[0]) == compile_cache.source_digest()
    edited = compile_cache.source_digest(copies[1])
    assert edited != compile_cache.source_digest()
    key = CacheKey.create("a", torch.device("cpu"), torch.float64, "float32", "default")
    monkeypatch.setattr(compile_cache, "source_digest", lambda: edited)
    other = CacheKey.create("a", torch.device("cpu"), torch.float64, "float32", "default")
    assert other.source == edited and other.name != key.name


def test_a_file_that_is_not_an_entry_is_reported_and_removed(tmp_path):
    cache = CompileCache(tmp_path)
    key = CacheKey.create("a", torch.device("cpu"), torch.float64, "float32", "default")
    cache.path(key).write_bytes(b"half a file")
    with pytest.warns(UserWarning, match="is unusable .not a fastcalc compile cache file"):
        assert cache.load(key, None) is None
    assert not cache.path(key).exists()


def test_the_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "fastcalc"


def test_clear_removes_every_entry(stored, tmp_path):
    copy = CompileCache(tmp_path)
    for entry in CompileCache(stored).entries():
        (tmp_path / entry.path.name).write_bytes(entry.path.read_bytes())
    assert len(copy.entries()) == 1
    assert copy.clear() == 1 and copy.entries() == []


def test_builds_in_progress_are_listed_and_clear_keeps_their_locks(tmp_path):
    """A lock that a building process holds (taken here by another process) names a build
    in progress and stays; the lock of a finished build goes."""
    cache = CompileCache(tmp_path)
    finished, running = (cache.lock_path(CacheKey.create(name, torch.device("cpu"), torch.float64,
                                                          "float32", "default"))
                         for name in ("finished", "running"))
    finished.touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\n"
         "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
         "time.sleep(60)", str(running)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cache.building() == [running.name.removesuffix(".lock")]
        cache.clear()
        assert not finished.exists() and running.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_folder_that_cannot_be_written_is_reported_and_nothing_breaks(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    key = CacheKey.create("a", torch.device("cpu"), torch.float64, "float32", "default")
    with pytest.warns(UserWarning, match="cannot store the compiled model"):
        assert CompileCache(blocked / "cache").store(key, SavedGraph("", {}, b"")) is None


def test_inputs_a_stored_graph_refuses_are_compiled_for(tmp_path):
    """A stored graph cannot recompile: float32 inputs to a float64 graph are traced and
    compiled in this process, and give ASE's numbers to float32 round-off."""
    key = CacheKey.create("morse-test", torch.device("cpu"), torch.float64, "float32", "default")
    inputs = graph_inputs(crystal((2, 2, 2)))
    GraphRunner(morse_efs, "default", CompileCache(tmp_path), lambda: key)(*inputs)
    runner = GraphRunner(morse_efs, "default", CompileCache(tmp_path), lambda: key)
    single = [x.float() if x.is_floating_point() else x for x in inputs]
    assert_ase_morse(*runner(*single), crystal((2, 2, 2)), rel=1e-6, atol=1e-5,
                     stress_atol=1e-6)  # float32 round-off
    assert runner.stats["from_cache"] == 1 and runner.stats["compilations"] == 1


def test_a_graph_first_called_on_a_view_takes_copies_without_compiling_again(tmp_path):
    """CUDA graphs call the compiled graph on copies of the first call's inputs; an input
    that was a view (PET's padded positions) must not tie the graph to views."""
    key = CacheKey.create("morse-view", torch.device("cpu"), torch.float64, "float32", "default")
    inputs = list(graph_inputs(crystal((2, 2, 2))))
    atoms = len(inputs[0])
    inputs[0] = torch.cat([inputs[0], inputs[0]])[:atoms]
    runner = GraphRunner(morse_efs, "default", CompileCache(tmp_path), lambda: key)
    runner(*inputs)
    energy, forces, stress = runner(*[x.clone() for x in inputs])
    assert_morse_numbers({"energy": float(energy), "forces": forces, "stress": stress})
    assert runner.stats["compilations"] == 1


def test_a_graph_that_cannot_be_compiled_ahead_is_reported_and_compiled_as_usual(
    tmp_path, monkeypatch
):
    def fails(*args):
        raise RuntimeError("not serialisable")

    monkeypatch.setattr("fastcalc.tracing.compile_ahead", fails)
    key = CacheKey.create("morse-fails", torch.device("cpu"), torch.float64, "float32", "default")
    runner = GraphRunner(morse_efs, "default", CompileCache(tmp_path), lambda: key)
    with pytest.warns(UserWarning, match="cannot be compiled ahead of time and stored .not serialis"):
        energy, forces, stress = runner(*graph_inputs(crystal((2, 2, 2))))
    assert_morse_numbers({"energy": float(energy), "forces": forces, "stress": stress})
    assert runner.stats["compilations"] == 1 and not CompileCache(tmp_path).entries()


def test_the_model_digest_names_content_not_storage():
    """Equal names, values and hyper-parameters give one digest however the tensors lie
    in memory; one changed value (by one ulp), name, dtype or hyper-parameter gives another."""
    torch.manual_seed(0)
    weights = {"a": torch.randn(4, 3, dtype=torch.float64), "b": torch.randn(5)}
    digest = tensors_digest(weights, {"layers": 2})
    relaid = {"a": weights["a"].t().contiguous().t(), "b": weights["b"].clone()}
    assert not relaid["a"].is_contiguous()
    assert tensors_digest(relaid, {"layers": 2}) == digest
    nudged = weights["b"].clone()
    nudged[3] = torch.nextafter(nudged[3], torch.tensor(np.inf))
    others = [
        ({**weights, "b": nudged}, {"layers": 2}),
        ({"c": weights["a"], "b": weights["b"]}, {"layers": 2}),
        ({**weights, "a": weights["a"].float()}, {"layers": 2}),
        (weights, {"layers": 3}),
    ]
    assert all(tensors_digest(tensors, extra) != digest for tensors, extra in others)


def test_a_file_system_that_refuses_locks_is_used_unlocked(tmp_path, monkeypatch):
    """Some network file systems refuse flock (ENOLCK): building goes on without a lock,
    as where there is no fcntl, rather than failing the calculator's call."""
    import errno
    import fcntl

    def refuse(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    path = tmp_path / "entry.lock"
    with locked(path) as taken:
        assert taken
    assert not held(path)
