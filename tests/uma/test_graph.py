"""Edges picked from Verlet candidates inside the graph (fastcalc.uma.graph.edges_within)
against ASE's own neighbour list."""

from __future__ import annotations

import numpy as np
import torch
from ase.build import bulk
from ase.neighborlist import neighbor_list

from fastcalc.buckets import padding_shift
from fastcalc.uma.graph import edges_within

CUTOFF = 4.0
SKIN = 0.5


def crystal():
    """A rattled triclinic copper cell with one atom doubled (a pair of zero length)."""
    atoms = bulk("Cu", "fcc", a=3.6).repeat((2, 2, 2))
    atoms.set_cell(atoms.cell.array + [[0.0, 0.1, 0.0], [0.2, 0.0, 0.0], [0.0, 0.0, 0.1]],
                   scale_atoms=True)
    atoms.rattle(0.1, seed=1)
    atoms += atoms[:1]
    return atoms


def candidates(atoms, seed: int = 0):
    """ASE's pairs within CUTOFF + SKIN, shuffled: (edge_index, shifts) tensors."""
    i, j, shifts = neighbor_list("ijS", atoms, CUTOFF + SKIN)
    order = np.random.default_rng(seed).permutation(len(i))
    return torch.tensor(np.stack([i, j])[:, order]), torch.tensor(shifts[order])


def picked(atoms, edge_index, shifts, width: int):
    cell = torch.tensor(atoms.cell.array)
    return edges_within(
        torch.tensor(atoms.positions), cell, edge_index, shifts, torch.arange(width),
        padding_shift(cell, CUTOFF), CUTOFF,
    )


def pair_set(edge_index, shifts) -> set:
    return {(int(i), int(j), *map(int, s)) for (i, j), s in zip(edge_index.T, shifts)}


def ase_edges(atoms) -> set:
    """ASE's pairs within CUTOFF, less the one of zero length (as fairchem's graphs)."""
    i, j, shifts, d = neighbor_list("ijSd", atoms, CUTOFF)
    return {(a, b, *map(int, s)) for a, b, s, dist in zip(i, j, shifts, d) if dist > 0}


def test_edges_within_keep_ases_pairs_within_the_cutoff_in_candidate_order():
    atoms = crystal()
    edge_index, shifts = candidates(atoms)
    expected = ase_edges(atoms)
    assert len(neighbor_list("i", atoms, CUTOFF)) == len(expected) + 2  # the doubled atom
    width = len(expected) + 37
    edges, count = picked(atoms, edge_index, shifts, width)
    assert int(count) == len(expected) == int(edges.edge_mask.sum())
    real = edges.edge_mask
    assert real[: len(expected)].all()  # packed first, padding after
    assert pair_set(edges.edge_index[:, real], edges.unit_shifts[real]) == expected
    # the candidates' order is kept
    position = {pair: k for k, pair in enumerate(
        (int(i), int(j), *map(int, s)) for (i, j), s in zip(edge_index.T, shifts))}
    kept = [position[(int(i), int(j), *map(int, s))]
            for (i, j), s in zip(edges.edge_index[:, real].T, edges.unit_shifts[real])]
    assert kept == sorted(kept)


def test_padded_edges_lie_beyond_the_cutoff():
    atoms = crystal()
    edges, count = picked(atoms, *candidates(atoms), width=int(1.2 * len(ase_edges(atoms))))
    pad = ~edges.edge_mask
    assert pad.sum() > 0
    assert (edges.edge_index[:, pad] == 0).all()
    lengths = (edges.unit_shifts[pad].double() @ torch.tensor(atoms.cell.array)).norm(dim=1)
    assert (lengths > CUTOFF).all()


def test_too_few_slots_keep_the_first_pairs_and_report_how_many_there_are():
    atoms = crystal()
    edge_index, shifts = candidates(atoms, seed=2)
    full, count = picked(atoms, edge_index, shifts, width=len(ase_edges(atoms)))
    short, short_count = picked(atoms, edge_index, shifts, width=50)
    assert int(short_count) == int(count) == len(ase_edges(atoms)) > 50
    assert short.edge_mask.all()
    assert torch.equal(short.edge_index, full.edge_index[:, :50])
    assert torch.equal(short.unit_shifts, full.unit_shifts[:50])
