"""The compile runtime: one traced-and-compiled energy/forces/stress graph gives ASE's
numbers at every size, and ``compile_mode`` has one meaning."""

import numpy as np
import pytest
import torch
from pair_potential import ase_morse, crystal, graph_inputs, morse_efs
from torch._dynamo.utils import counters

from fastcalc.tracing import GraphRunner, resolve_compile_mode, trace


@pytest.fixture(scope="module")
def compiled():
    return GraphRunner(morse_efs, "default")


def test_one_compilation_matches_ase_at_every_size(compiled):
    before = counters["stats"]["unique_graphs"]
    compiled(*graph_inputs(crystal((2, 2, 2))))
    assert counters["stats"]["unique_graphs"] == before + 1
    for repeats in [(2, 2, 3), (3, 3, 3), (2, 2, 2)]:
        atoms = crystal(repeats)
        energy, forces, stress = compiled(*graph_inputs(atoms))
        reference = atoms.copy()
        reference.calc = ase_morse()
        assert float(energy) == pytest.approx(reference.get_potential_energy(), rel=1e-12)
        np.testing.assert_allclose(forces.numpy(), reference.get_forces(), atol=1e-10)
        voigt = stress.numpy()[[0, 1, 2, 1, 0, 0], [0, 1, 2, 2, 2, 1]]
        np.testing.assert_allclose(voigt, reference.get_stress(), atol=1e-12)
    assert counters["stats"]["unique_graphs"] == before + 1
    assert compiled.stats == {"compilations": 1, "cuda_graphs": 0, "recompiles": 0, "from_cache": 0,
                             "building": 0}


def test_auto_means_eager_on_cpu():
    assert resolve_compile_mode("auto", torch.device("cpu")) == "eager"


def test_an_unknown_compile_mode_lists_the_choices():
    with pytest.raises(ValueError, match="'auto', 'eager', 'default', 'reduce-overhead'; got 'fast'"):
        resolve_compile_mode("fast", torch.device("cpu"))


def test_profiler_ranges_are_stripped_from_the_graph():
    def annotated(x):
        with torch.profiler.record_function("block"):
            return (x.sin(),)

    graph = trace(annotated, [torch.randn(5)])
    targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert targets == ["aten.sin.default"]
    torch.testing.assert_close(graph(torch.ones(3))[0], torch.ones(3).sin())


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_runner_leaves_compiled_code_behind_and_compiles_anew(how, compiled):
    import copy
    import pickle

    inputs = graph_inputs(crystal((2, 2, 2)))
    expected = [x.clone() for x in compiled(*inputs)]
    other = copy.deepcopy(compiled) if how == "deepcopy" else pickle.loads(pickle.dumps(compiled))
    assert other.stats == {"compilations": 0, "cuda_graphs": 0, "recompiles": 0, "from_cache": 0,
                             "building": 0}
    for ours, theirs in zip(other(*inputs), expected):
        torch.testing.assert_close(ours, theirs, rtol=1e-13, atol=0)
    assert other.stats["compilations"] == 1 and compiled.stats["compilations"] == 1
