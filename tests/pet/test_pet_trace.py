"""Tracing guards. The compiled graph itself is tested through the calculator
(``test_pet_calculator.py::test_compiled_calculator_across_buckets``)."""

from __future__ import annotations

import copy

import pytest
import torch

from fastcalc.neighbors import neighbor_list
from fastcalc.pet.layout import prepare_candidates, species_of
from fastcalc.pet.trace import graph_inputs, trace_pet

from .support import make_structure


def test_tracing_refuses_trainable_weights(loaded):
    core, metadata = loaded("single_layer")
    atoms = make_structure("tiny")
    positions = torch.tensor(atoms.positions, dtype=metadata.dtype)
    cell = torch.tensor(atoms.cell.array, dtype=metadata.dtype)
    species = species_of(torch.tensor(atoms.numbers), core.species_index)
    edges = neighbor_list(positions, cell, torch.tensor(atoms.pbc), metadata.cutoff)
    candidates = prepare_candidates(*edges, len(atoms), cell, metadata.cutoff)
    trainable = copy.deepcopy(core).requires_grad_(True)
    with pytest.raises(ValueError, match="requires_grad"):
        trace_pet(trainable, graph_inputs(positions, cell, species, candidates, torch.arange(20)))
