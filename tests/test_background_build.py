"""Compiling in the background: without a stored graph, calls run uncompiled (ASE's
Morse numbers) while another process compiles and stores the graph, then load it; a
second runner of the same model waits for that process instead of compiling too; with
the graph stored, the first call runs uncompiled too (in plain torch) while the graph
is read and the compiler imported; a graph read unusable is reported and built again;
a failed build is reported and compiled in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch
from pair_potential import assert_ase_morse, crystal, graph_inputs, morse_efs

from fastcalc.background_build import BackgroundBuild
from fastcalc.compile_cache import CacheKey, CompileCache, held


def key(name: str) -> CacheKey:
    return CacheKey.create(name, torch.device("cpu"), torch.float64, "float32", "default")


def runner(folder, name: str, fn=morse_efs):
    from fastcalc.tracing import GraphRunner

    return GraphRunner(fn, "default", CompileCache(folder), lambda: key(name), background=True)


def test_calls_run_uncompiled_until_another_process_has_stored_the_graph(tmp_path, capfd):
    atoms = crystal((2, 2, 2))
    first, second = runner(tmp_path, "morse-bg"), runner(tmp_path, "morse-bg")
    assert_ase_morse(*first(*graph_inputs(atoms)), atoms)
    build = first._build
    assert first.stats["building"] == 1 and first.stats["compilations"] == 0
    assert build.process is not None  # a process of its own compiles

    assert_ase_morse(*second(*graph_inputs(atoms)), atoms)
    assert second._build.process is None  # the same model: it waits for that process

    second.wait()  # returns once that process is done
    assert second.stats["building"] == 0
    first.wait()
    lock = CompileCache(tmp_path).lock_path(key("morse-bg"))
    assert build.process.returncode == 0 and not held(lock)
    other = crystal((2, 2, 3))  # another size: the stored graph has dynamic shapes
    for each in (first, second):
        assert_ase_morse(*each(*graph_inputs(other)), other)
        assert "calls run compiled from now on" in capfd.readouterr().err  # as announced
        assert each.stats == {"compilations": 0, "cuda_graphs": 0, "recompiles": 0,
                              "from_cache": 1, "building": 0}
    assert not build.folder.exists()  # its temporary folder is gone


def test_with_the_graph_stored_the_first_call_runs_uncompiled_and_a_later_one_loads_it(tmp_path):
    """Loading imports the compiler (seconds): the first result does not wait for it."""
    from fastcalc.tracing import GraphRunner

    atoms = crystal((2, 2, 2))
    GraphRunner(morse_efs, "default", CompileCache(tmp_path), lambda: key("morse-warm"))(
        *graph_inputs(atoms))  # compiles and stores the graph in this process
    warm = runner(tmp_path, "morse-warm")
    assert_ase_morse(*warm(*graph_inputs(atoms)), atoms)
    assert warm.stats["from_cache"] == 0 and warm._build is None  # uncompiled, nothing built
    warm.wait()
    other = crystal((2, 2, 3))
    assert_ase_morse(*warm(*graph_inputs(other)), other)
    assert warm.stats == {"compilations": 0, "cuda_graphs": 0, "recompiles": 0,
                          "from_cache": 1, "building": 0}


def test_uncompiled_calls_run_in_plain_torch_and_the_traced_function_does_not(tmp_path):
    """Plain torch: fastcalc's model code calls none of its custom operators, whose first
    call imports dynamo; the compiled graph keeps them."""
    from fastcalc.plain_torch import is_plain
    from fastcalc.tracing import GraphRunner

    plain = []

    def noting(*inputs):
        plain.append(is_plain())
        return morse_efs(*inputs)

    atoms = crystal((2, 2, 2))
    GraphRunner(noting, "default", CompileCache(tmp_path), lambda: key("morse-plain"))(
        *graph_inputs(atoms))  # traced and stored in this process
    assert plain and not any(plain)
    traced = len(plain)
    warm = runner(tmp_path, "morse-plain", fn=noting)
    assert_ase_morse(*warm(*graph_inputs(atoms)), atoms)
    assert plain[traced:] == [True]
    warm.wait()
    assert_ase_morse(*warm(*graph_inputs(atoms)), atoms)
    assert len(plain) == traced + 1 and warm.stats["from_cache"] == 1


_IMPORTS_SEEN = """
import importlib.abc, json, sys, threading
importing = {}

class NoteImports(importlib.abc.MetaPathFinder):  # which thread imports dynamo first
    def find_spec(self, name, path, target=None):
        if name == "torch._dynamo":
            importing.setdefault(name, threading.current_thread().name)
        return None

sys.meta_path.insert(0, NoteImports())
from pair_potential import crystal, graph_inputs, morse_efs
from fastcalc.compile_cache import CacheKey, CompileCache
from fastcalc.tracing import GraphRunner
import torch
key = CacheKey.create("morse-imports", torch.device("cpu"), torch.float64, "float32", "default")
warm = GraphRunner(morse_efs, "default", CompileCache(sys.argv[1]), lambda: key, background=True)
atoms = crystal((2, 2, 2))
first = [x.tolist() for x in warm(*graph_inputs(atoms))]
warm.wait()
later = [x.tolist() for x in warm(*graph_inputs(atoms))]
print(json.dumps({"first": first, "later": later, "stats": warm.stats,
                  "dynamo": importing.get("torch._dynamo")}))
"""


def test_a_process_that_finds_the_graph_stored_imports_the_compiler_in_a_thread(tmp_path):
    """Its first result waits for no import of dynamo (a second or more): neither the
    neighbour search nor finding the stored graph imports it, a thread does after that
    result, and the graph is read and loaded after that."""
    from fastcalc.tracing import GraphRunner

    atoms = crystal((2, 2, 2))
    GraphRunner(morse_efs, "default", CompileCache(tmp_path), lambda: key("morse-imports"))(
        *graph_inputs(atoms))
    tests = Path(__file__).parent
    done = subprocess.run([sys.executable, "-c", _IMPORTS_SEEN, str(tmp_path)],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(tests)})
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["dynamo"] == "fastcalc-compiler-imports"
    assert seen["stats"]["from_cache"] == 1 and seen["stats"]["compilations"] == 0
    for outputs in (seen["first"], seen["later"]):
        assert_ase_morse(*outputs, atoms)


def test_a_stored_graph_read_unusable_in_the_background_is_reported_and_built_again(tmp_path):
    """The first call reads the stored graph in a thread while it runs uncompiled; the
    damage is reported at the next call, which has another process build the graph."""
    from fastcalc.tracing import GraphRunner

    atoms = crystal((2, 2, 2))
    GraphRunner(morse_efs, "default", CompileCache(tmp_path), lambda: key("morse-damaged"))(
        *graph_inputs(atoms))
    entry = CompileCache(tmp_path).path(key("morse-damaged"))
    entry.write_bytes(entry.read_bytes()[:-100])  # its end lost
    damaged = runner(tmp_path, "morse-damaged")
    assert_ase_morse(*damaged(*graph_inputs(atoms)), atoms)
    damaged.wait()  # the reading is over, not yet reported
    with pytest.warns(UserWarning, match="is unusable .its contents do not match"):
        assert_ase_morse(*damaged(*graph_inputs(atoms)), atoms)
    assert damaged._build.process is not None and damaged.stats["building"] == 1
    damaged.wait()
    assert_ase_morse(*damaged(*graph_inputs(atoms)), atoms)
    assert damaged.stats["from_cache"] == 1 and damaged.stats["compilations"] == 0


def test_a_failed_build_is_reported_and_compiled_in_this_process(tmp_path, monkeypatch):
    """The function's module exists here only, so the building process cannot read it."""
    module = types.ModuleType("only_in_this_process")
    module.morse_efs = lambda *inputs: morse_efs(*inputs)
    module.morse_efs.__module__ = module.__name__
    module.morse_efs.__qualname__ = "morse_efs"
    monkeypatch.setitem(sys.modules, module.__name__, module)
    atoms = crystal((2, 2, 2))
    failing = runner(tmp_path, "morse-fails", module.morse_efs)
    assert_ase_morse(*failing(*graph_inputs(atoms)), atoms)
    failing.wait()
    with pytest.warns(UserWarning, match="in the background failed .process .* exited with 1: "
                                         ".*only_in_this_process"):
        outputs = failing(*graph_inputs(atoms))
    assert_ase_morse(*outputs, atoms)
    assert failing.stats["compilations"] == 1 and failing.stats["building"] == 0


def test_a_function_that_cannot_leave_the_process_is_compiled_here(tmp_path):
    def closure(*inputs):
        return morse_efs(*inputs)

    inputs = graph_inputs(crystal((2, 2, 2)))
    folders = set(Path(tempfile.gettempdir()).glob("fastcalc-build-*"))
    started = BackgroundBuild.start(CompileCache(tmp_path), key("closure"), closure, None, inputs)
    assert started is None
    assert set(Path(tempfile.gettempdir()).glob("fastcalc-build-*")) == folders  # none left


def test_an_uncompiled_call_out_of_memory_waits_for_the_compiled_model(tmp_path):
    atoms = crystal((2, 2, 2))
    patient = runner(tmp_path, "morse-oom")
    patient(*graph_inputs(atoms))  # starts the build

    def out_of_memory(*inputs):
        raise torch.OutOfMemoryError("the uncompiled model needs more memory")

    patient.fn = out_of_memory  # now, only for the uncompiled calls
    assert_ase_morse(*patient(*graph_inputs(atoms)), atoms)
    assert patient.stats["from_cache"] == 1 and patient.stats["building"] == 0
