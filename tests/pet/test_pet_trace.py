"""The traced-and-compiled PET graph gives the eager numbers at several sizes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from fastcalc.pet.energy import energy_and_derivatives
from fastcalc.pet.layout import structure_layout

from .support import make_structure


def graph_inputs(core, metadata, structure):
    atoms = make_structure(structure)
    positions = torch.tensor(atoms.positions, dtype=metadata.dtype)
    cell = torch.tensor(atoms.cell.array, dtype=metadata.dtype)
    numbers = torch.tensor(atoms.numbers)
    return (
        positions,
        cell,
        structure_layout(positions, cell, atoms.pbc, numbers, metadata.hypers, core.species_index),
    )


@pytest.mark.compile
def test_compiled_graph_matches_eager_without_recompiling(loaded):
    from fastcalc.pet.trace import compile_pet

    core, metadata = loaded("single_layer")
    compiled = compile_pet(core, *graph_inputs(core, metadata, "bulk"))
    compiled(*graph_inputs(core, metadata, "bulk"))
    graphs = counters["stats"]["unique_graphs"]
    for structure in ("tiny", "bulk"):
        inputs = graph_inputs(core, metadata, structure)
        for ours, eager in zip(
            compiled(*inputs), energy_and_derivatives(core, *inputs), strict=True
        ):
            torch.testing.assert_close(ours, eager, rtol=1e-10, atol=1e-12)
    assert counters["stats"]["unique_graphs"] == graphs


def test_tracing_refuses_trainable_weights(loaded):
    from fastcalc.pet.trace import trace_pet

    core, metadata = loaded("single_layer")
    trainable = copy.deepcopy(core).requires_grad_(True)
    with pytest.raises(ValueError, match="requires_grad"):
        trace_pet(trainable, *graph_inputs(core, metadata, "tiny"))
