"""Geometry helpers of the compiled graphs, against ASE."""

import numpy as np
import torch
from ase import Atoms

from fastcalc.geometry import cell_volumes


def test_cell_volumes_are_ases_for_cells_of_either_handedness():
    cells = np.random.default_rng(3).normal(size=(16, 3, 3))
    cells[::2] = cells[::2, ::-1]  # rows swapped: the other handedness
    expected = [Atoms(cell=cell, pbc=True).get_volume() for cell in cells]
    assert np.allclose(cell_volumes(torch.from_numpy(cells)).numpy(), expected, rtol=1e-12)
    assert np.isclose(float(cell_volumes(torch.from_numpy(cells[1]))), expected[1], rtol=1e-12)
