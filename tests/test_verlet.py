"""The Verlet-skin neighbor list searches rarely and returns exactly the cutoff's edges."""

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.neighborlist import neighbor_list as ase_neighbor_list

from fastcalc.neighbors import HostGeometry, VerletNeighborList

CUTOFF, SKIN = 4.0, 0.6


def edges(nl, atoms):
    edge_index, shifts = nl(torch.tensor(atoms.positions), torch.tensor(atoms.cell.array),
                            torch.tensor(atoms.pbc))
    return sorted(zip(*edge_index.tolist(), *shifts.T.tolist()))


def ase_edges(atoms):
    i, j, shifts = ase_neighbor_list("ijS", atoms, CUTOFF)
    return sorted(zip(i.tolist(), j.tolist(), *shifts.T.tolist()))


def crystal():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.rattle(0.05, seed=0)
    return atoms


def test_small_moves_reuse_the_search_and_stay_exact():
    atoms, nl = crystal(), VerletNeighborList(CUTOFF, SKIN)
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert edges(nl, atoms) == ase_edges(atoms)
        atoms.positions += rng.uniform(-0.02, 0.02, atoms.positions.shape)
    assert nl.searches == 1


def test_most_candidates_is_the_largest_count_of_pairs_within_cutoff_plus_skin():
    atoms, nl = crystal(), VerletNeighborList(CUTOFF, SKIN)
    edges(nl, atoms)
    centres = ase_neighbor_list("i", atoms, CUTOFF + SKIN)
    assert nl.most_candidates == np.bincount(centres).max()


def test_a_move_beyond_half_the_skin_searches_again():
    atoms, nl = crystal(), VerletNeighborList(CUTOFF, SKIN)
    edges(nl, atoms)
    atoms.positions[3] += [0.31, 0, 0]
    assert edges(nl, atoms) == ase_edges(atoms)
    assert nl.searches == 2


@pytest.mark.parametrize("scale_atoms", [True, False])
def test_a_cell_change_searches_again(scale_atoms):
    """Also when the atoms stay put: then only the images' offsets change."""
    atoms, nl = crystal(), VerletNeighborList(CUTOFF, SKIN)
    edges(nl, atoms)
    atoms.set_cell(atoms.cell * 1.05, scale_atoms=scale_atoms)
    assert edges(nl, atoms) == ase_edges(atoms)
    assert nl.searches == 2


def test_a_pbc_or_atom_count_change_searches_again():
    atoms, nl = crystal(), VerletNeighborList(CUTOFF, SKIN)
    edges(nl, atoms)
    atoms.pbc = [True, True, False]
    assert edges(nl, atoms) == ase_edges(atoms)
    del atoms[0]
    assert edges(nl, atoms) == ase_edges(atoms)
    assert nl.searches == 3


def test_candidates_are_the_stored_search_until_it_goes_stale():
    atoms, nl = crystal(), VerletNeighborList(CUTOFF, SKIN)
    inputs = lambda: (torch.tensor(atoms.positions), torch.tensor(atoms.cell.array),  # noqa: E731
                      torch.tensor(atoms.pbc))
    edge_index, shifts = nl.candidates(*inputs())
    found = set(zip(*edge_index.tolist(), *shifts.T.tolist()))
    i, j, s = ase_neighbor_list("ijS", atoms, CUTOFF + SKIN)
    assert found == set(zip(i.tolist(), j.tolist(), *s.T.tolist()))
    atoms.positions[3] += [0.1, 0, 0]
    assert nl.candidates(*inputs())[0] is edge_index
    atoms.positions[3] += [0.2, 0, 0]
    assert nl.candidates(*inputs())[0] is not edge_index and nl.searches == 2


def test_host_geometry_decides_staleness_as_the_device_would():
    atoms = crystal()
    on_device, on_host = VerletNeighborList(CUTOFF, SKIN), VerletNeighborList(CUTOFF, SKIN)
    moves = [(3, [0.1, 0, 0]), (3, [0.25, 0, 0]), (0, [0, 0.05, 0]), (5, [0, 0, -0.35])]
    for atom, move in [(0, [0, 0, 0]), *moves]:
        atoms.positions[atom] += move
        tensors = (torch.tensor(atoms.positions), torch.tensor(atoms.cell.array),
                   torch.tensor(atoms.pbc))
        host = HostGeometry(atoms.positions, atoms.cell.array, atoms.pbc)
        edge_index, shifts = on_host(*tensors, host=host)
        assert sorted(zip(*edge_index.tolist(), *shifts.T.tolist())) == ase_edges(atoms)
        on_device(*tensors)
        assert on_host.searches == on_device.searches
    assert on_host.searches == 3
    atoms.set_cell(atoms.cell * 1.01, scale_atoms=True)
    host = HostGeometry(atoms.positions, atoms.cell.array, atoms.pbc)
    on_host(torch.tensor(atoms.positions), torch.tensor(atoms.cell.array),
            torch.tensor(atoms.pbc), host=host)
    assert on_host.searches == 4


@pytest.mark.parametrize("skin", [0.0, SKIN])
def test_zero_length_pairs_can_be_dropped_from_the_edges_not_the_candidates(skin):
    """Two copies of atom 3 at its position: ASE pairs them at length 0 (both ways); with
    ``drop_zero_length`` the edges are ASE's less those two, the candidates keep them."""
    atoms = crystal()
    atoms += atoms[[3]]
    i, j, d, shifts = ase_neighbor_list("ijdS", atoms, CUTOFF)
    kept = d > 0
    expected = sorted(zip(i[kept].tolist(), j[kept].tolist(), *shifts[kept].T.tolist()))
    assert (~kept).sum() == 2
    nl = VerletNeighborList(CUTOFF, skin, drop_zero_length=True)
    assert edges(nl, atoms) == expected
    candidates, _ = nl.candidates(torch.tensor(atoms.positions), torch.tensor(atoms.cell.array),
                                  torch.tensor(atoms.pbc))
    pairs = set(zip(*candidates.tolist()))
    assert (3, len(atoms) - 1) in pairs and (len(atoms) - 1, 3) in pairs
    assert edges(VerletNeighborList(CUTOFF, skin), atoms) == ase_edges(atoms)  # the default
