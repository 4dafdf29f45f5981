"""The padded neighbour layout: minimal width, correct reverse edges, checked inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.neighborlist import neighbor_list

from fastcalc.buckets import padding_cell
from fastcalc.pet.layout import pad_candidates, pair_vectors, prepare_candidates, structure_layout

from .support import make_structure


def layout_of(core, metadata, atoms):
    positions = torch.tensor(atoms.positions, dtype=metadata.dtype)
    cell = torch.tensor(atoms.cell.array, dtype=metadata.dtype)
    numbers = torch.tensor(atoms.numbers)
    return (
        positions,
        cell,
        structure_layout(positions, cell, atoms.pbc, numbers, metadata.hypers, core.species_index),
    )


@pytest.mark.parametrize("structure", ["bulk", "tiny", "molecule"])
def test_width_is_the_largest_neighbour_count(structure, loaded):
    core, metadata = loaded("fixed")
    atoms = make_structure(structure)
    _, _, layout = layout_of(core, metadata, atoms)
    counts = np.bincount(neighbor_list("i", atoms, metadata.cutoff), minlength=len(atoms))
    assert layout.neighbors.shape == (len(atoms), counts.max())
    assert layout.mask.sum(dim=1).tolist() == counts.tolist()


def test_adaptive_cutoff_keeps_fewer_neighbours(loaded):
    core, metadata = loaded("adaptive")
    atoms = make_structure("bulk")
    _, _, layout = layout_of(core, metadata, atoms)
    full = np.bincount(neighbor_list("i", atoms, metadata.cutoff), minlength=len(atoms))
    assert layout.neighbors.shape[1] < full.max()
    assert int(layout.mask.sum()) < full.sum()


@pytest.mark.parametrize("model", ["fixed", "adaptive"])
def test_reverse_slot_holds_the_opposite_edge(model, loaded):
    core, metadata = loaded(model)
    positions, cell, layout = layout_of(core, metadata, make_structure("tiny"))
    centers = torch.arange(len(positions))[:, None]
    vectors = pair_vectors(positions, cell, centers, layout.neighbors, layout.shifts).reshape(-1, 3)
    real = layout.mask.reshape(-1)
    reverse = layout.reverse.reshape(-1)[real]
    assert bool(layout.mask.reshape(-1)[reverse].all())
    torch.testing.assert_close(vectors[reverse], -vectors[real], rtol=0, atol=1e-12)


def test_unsupported_elements_are_rejected(loaded):
    core, metadata = loaded("fixed")
    atoms = make_structure("molecule")
    atoms.numbers[0] = 14
    with pytest.raises(ValueError, match=r"\[14\]"):
        layout_of(core, metadata, atoms)


def test_energy_ignores_what_fills_the_padding(loaded):
    core, metadata = loaded("fixed")
    positions, cell, layout = layout_of(core, metadata, make_structure("bulk"))
    assert not bool(layout.mask.all())
    elsewhere = layout._replace(
        neighbors=torch.where(layout.mask, layout.neighbors, 0),
        shifts=torch.where(layout.mask[..., None], layout.shifts, 1),
    )
    with torch.no_grad():
        torch.testing.assert_close(
            core(positions, cell, elsewhere), core(positions, cell, layout), rtol=1e-13, atol=0
        )


@pytest.mark.parametrize("structure", ["bulk", "slab", "tiny", "isolated"])
def test_candidate_rows_hold_each_atoms_pairs_and_their_reverses(structure):
    """Row i of the padded candidates holds exactly ASE's pairs of centre i; the rest is
    self-pairs beyond the cutoff; every entry's reverse entry is the reversed pair."""
    cutoff = 4.0
    atoms = make_structure(structure)
    cell = padding_cell(torch.tensor(atoms.cell.array), cutoff)
    positions = torch.tensor(atoms.positions)
    i, j, shifts = neighbor_list("ijS", atoms, cutoff)
    exact = prepare_candidates(
        torch.tensor(np.stack([i, j])), torch.tensor(shifts), len(atoms), cell, cutoff
    )
    n, columns = len(atoms), exact.neighbors.shape[1]
    grid = pad_candidates(exact, cell, cutoff, n + 3, columns + 5)
    assert grid.neighbors.shape == (n + 3, columns + 5)
    rows = torch.arange(n + 3)[:, None].expand_as(grid.neighbors)
    padded_positions = torch.cat([positions, positions.new_zeros(3, 3)])
    lengths = pair_vectors(padded_positions, cell, rows, grid.neighbors, grid.shifts).norm(dim=-1)
    real = lengths < cutoff
    found = sorted(zip(rows[real].tolist(), grid.neighbors[real].tolist(),
                       *grid.shifts[real].T.tolist()))
    assert found == sorted(zip(i.tolist(), j.tolist(), *shifts.T.tolist()))
    assert torch.equal(grid.neighbors[~real], rows[~real])
    assert columns == (np.bincount(i, minlength=n).max() if len(i) else 0)
    back = grid.reverse.reshape(-1)
    assert torch.equal(back[back], torch.arange(back.numel()))
    assert torch.equal(rows.reshape(-1)[back], grid.neighbors.reshape(-1))
    assert torch.equal(grid.shifts.reshape(-1, 3)[back][real.reshape(-1)],
                       -grid.shifts[real])
