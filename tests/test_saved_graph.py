"""A graph compiled ahead of time by ``fastcalc.saved_graph`` runs in a fresh process
without tracing, at sizes it was not traced at, on the model's own tensors, equal to the
eager model; it refuses inputs it was not compiled for instead of recompiling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from saved_graph_worker import Toy, inputs

from fastcalc.saved_graph import GuardsRefused, compile_ahead
from fastcalc.tracing import trace

WORKER = Path(__file__).with_name("saved_graph_worker.py")


def run(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(WORKER), *map(str, args)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def eager(atoms: int, scale: float = 1.0) -> dict:
    toy = Toy()
    toy.linear.weight.mul_(scale)
    energy, forces = toy.energy_and_forces(*inputs(atoms))
    return {"energy": float(energy), "forces": forces.tolist()}


def assert_same(ours: dict, reference: dict) -> None:
    assert ours["energy"] == pytest.approx(reference["energy"], rel=1e-5)
    np.testing.assert_allclose(ours["forces"], reference["forces"], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("saved")
    assert_same(run("save", folder, 7), eager(7))
    return folder


def test_a_fresh_process_loads_the_graph_and_runs_a_new_size(saved):
    assert_same(run("load", saved, 11), eager(11))


def test_in_place_updates_of_the_model_reach_the_loaded_graph(saved):
    assert_same(run("load", saved, 9, "--scale", 1.5), eager(9, scale=1.5))


def test_a_graph_reading_a_tensor_the_model_does_not_hold_is_refused():
    toy = Toy()
    stray = torch.ones(3)
    graph = trace(lambda positions, species: toy.energy_and_forces(positions * stray, species),
                  inputs(5))
    with pytest.raises(ValueError, match="is not one of the model's"):
        compile_ahead(graph, toy, inputs(5))


def test_inputs_the_graph_was_not_compiled_for_are_refused():
    toy = Toy()
    graph = trace(toy.energy_and_forces, inputs(5))
    run, _ = compile_ahead(graph, toy, inputs(5))
    positions, species = inputs(6)
    with pytest.raises(GuardsRefused):
        run(positions.double(), species)


def test_importing_fastcalc_leaves_dynamo_to_the_first_compilation():
    """``import fastcalc`` (the calculators, the disk cache, the tracing runtime) does not
    import dynamo; a process imports it when it compiles or loads a graph."""
    code = ("import sys, fastcalc, fastcalc.models, fastcalc.tracing; "
            "print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
