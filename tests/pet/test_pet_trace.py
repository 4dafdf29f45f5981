"""Tracing guards. The compiled graph itself is tested through the calculator
(``test_pet_calculator.py::test_compiled_calculator_across_buckets``)."""

from __future__ import annotations

import copy

import pytest
import torch

from fastcalc.pet.layout import structure_layout
from fastcalc.pet.trace import graph_inputs, trace_pet

from .support import make_structure


def test_tracing_refuses_trainable_weights(loaded):
    core, metadata = loaded("single_layer")
    atoms = make_structure("tiny")
    positions = torch.tensor(atoms.positions, dtype=metadata.dtype)
    cell = torch.tensor(atoms.cell.array, dtype=metadata.dtype)
    numbers = torch.tensor(atoms.numbers)
    layout = structure_layout(
        positions, cell, atoms.pbc, numbers, metadata.hypers, core.species_index
    )
    trainable = copy.deepcopy(core).requires_grad_(True)
    with pytest.raises(ValueError, match="requires_grad"):
        trace_pet(trainable, graph_inputs(positions, cell, layout))
