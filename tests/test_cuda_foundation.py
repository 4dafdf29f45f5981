"""The foundation on a CUDA device: same edges and same numbers as on ASE's side."""

import numpy as np
import pytest
import torch
from ase.build import bulk, molecule
from pair_potential import CUTOFF, ase_morse, morse_energy
from test_neighbors import STRUCTURES, ase_edges

from fastcalc import PotentialCalculator
from fastcalc.calculator import free_memory
from fastcalc.neighbors import neighbor_list

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("name", STRUCTURES)
def test_neighbor_list_on_cuda_matches_ase(name):
    atoms = STRUCTURES[name]()
    edge_index, shifts = neighbor_list(
        torch.tensor(atoms.positions, device="cuda"),
        torch.tensor(atoms.cell.array, device="cuda"),
        torch.tensor(atoms.pbc, device="cuda"),
        5.0,
    )
    assert edge_index.is_cuda and shifts.is_cuda
    assert sorted(zip(*edge_index.tolist(), *shifts.T.tolist())) == ase_edges(atoms, 5.0)


@pytest.mark.parametrize("periodic", [True, False])
def test_calculator_on_cuda_matches_ase(periodic):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(3) if periodic else molecule("C60")
    atoms.rattle(0.05, seed=1)
    atoms.calc = PotentialCalculator(morse_energy, CUTOFF, dtype="float64")
    assert atoms.calc.device.type == "cuda"
    expected = atoms.copy()
    expected.calc = ase_morse()
    assert atoms.get_potential_energy() == pytest.approx(expected.get_potential_energy(), rel=1e-12)
    np.testing.assert_allclose(atoms.get_forces(), expected.get_forces(), atol=1e-10)
    if periodic:
        np.testing.assert_allclose(atoms.get_stress(), expected.get_stress(), atol=1e-12)


def test_free_memory_is_what_cuda_reports_free_plus_torch_s_unused_reserve():
    device = torch.device("cuda")
    block = torch.empty(2**28, dtype=torch.uint8, device=device)  # 256 MiB reserved
    del block  # now reserved by torch's allocator, unused: still free for a model
    free, total = torch.cuda.mem_get_info(device)
    assert free + 2**28 <= free_memory(device) <= total
