"""Neighbour topology for the UMA core (integers and masks, no gradients).

Convention (shared with :mod:`fastcalc.uma.core`): ``edge_index[0]`` = centre
``i``, ``edge_index[1]`` = neighbour ``j``, edge vector
``positions[j] - positions[i] + unit_shifts @ cell``.

:func:`edges_within` picks the edges from a Verlet list's candidates with tensor
operations only, so that it runs inside the compiled graph, ahead of the model, and a
call never waits for the device to learn how many edges there are.
"""

from __future__ import annotations

import numpy as np
import torch

from ..buckets import PaddedEdges
from ..geometry import edge_vectors
from ..neighbors import neighbor_list


def limit_neighbors(
    edge_index: torch.Tensor,
    squared_lengths: torch.Tensor,
    num_atoms: int,
    max_neighbors: int,
    tolerance: float = 0.01,
) -> torch.Tensor | None:
    """Boolean mask of the edges fairchem keeps under its ``max_neighbors`` rule, or
    None when no centre has more than ``max_neighbors`` edges (all are kept).

    fairchem's non-strict rule, per centre atom with more than
    ``max_neighbors`` edges: sort the *squared* distances, take the one at
    0-based position ``max_neighbors`` (i.e. the ``max_neighbors + 1``-th
    nearest) and keep every edge whose squared distance is at most that value
    plus ``tolerance`` (0.01 A^2).  So at least ``max_neighbors + 1`` edges
    survive, and near-degenerate shells are never split.  Runs on any device.
    """
    centre = edge_index[0]
    counts = torch.bincount(centre, minlength=max(num_atoms, 1))
    if max_neighbors <= 0 or int(counts.max()) <= max_neighbors:  # one host synchronisation
        return None
    by_length = torch.argsort(squared_lengths)
    order = by_length[torch.argsort(centre[by_length], stable=True)]  # by centre, then length
    first = torch.cumsum(counts, 0) - counts  # index in `order` of each centre's first edge
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device) - first[centre[order]]
    threshold = squared_lengths.new_full((num_atoms,), float("inf"))
    at_limit = rank == max_neighbors
    threshold[centre[at_limit]] = squared_lengths[at_limit] + tolerance
    return squared_lengths <= threshold[centre]


def apply_neighbor_limit(
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    squared_lengths: torch.Tensor,
    num_atoms: int,
    max_neighbors: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The edges :func:`limit_neighbors` keeps (the inputs themselves when none is dropped)."""
    keep = limit_neighbors(edge_index, squared_lengths, num_atoms, max_neighbors)
    if keep is None:
        return edge_index, unit_shifts
    return edge_index[:, keep], unit_shifts[keep]


def build_topology(
    positions: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    cutoff: float,
    max_neighbors: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neighbour list within ``cutoff`` (:func:`fastcalc.neighbors.neighbor_list`, on the
    CPU in float64) without pairs of zero length (coincident atoms), then filtered by
    fairchem's ``max_neighbors`` rule: fairchem's graph, in that order."""
    pos = torch.as_tensor(positions, dtype=torch.float64)
    lattice = torch.as_tensor(cell, dtype=torch.float64)
    edge_index, unit_shifts = neighbor_list(
        pos, lattice, torch.as_tensor(np.asarray(pbc, dtype=bool)), float(cutoff)
    )
    vectors = pos[edge_index[1]] - pos[edge_index[0]] + unit_shifts.double() @ lattice
    squared_lengths = vectors.square().sum(-1)
    nonzero = squared_lengths > 0
    return apply_neighbor_limit(
        edge_index[:, nonzero], unit_shifts[nonzero], squared_lengths[nonzero], len(positions),
        max_neighbors,
    )


@torch.no_grad()
def kept_candidates(
    positions: torch.Tensor,
    cell: torch.Tensor,
    candidate_index: torch.Tensor,
    candidate_shifts: torch.Tensor,
    cutoff: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which candidate pairs are edges of fairchem's graph on this geometry (shorter than
    ``cutoff``, longer than zero), and their squared lengths; ``cell`` (3, 3)."""
    squared = edge_vectors(positions, cell, candidate_index, candidate_shifts).square().sum(-1)
    return (squared < cutoff**2) & (squared > 0), squared


@torch.no_grad()
def edges_within(
    positions: torch.Tensor,
    cell: torch.Tensor,
    candidate_index: torch.Tensor,
    candidate_shifts: torch.Tensor,
    slots: torch.Tensor,
    padding_shift: torch.Tensor,
    cutoff: float,
) -> tuple[PaddedEdges, torch.Tensor]:
    """The candidates :func:`kept_candidates` keeps, in their order, packed into
    ``len(slots)`` edges (``slots`` is ``arange(width)``) padded as
    :func:`fastcalc.buckets.pad_edges` pads (centre and neighbour 0, ``padding_shift``),
    and how many were kept (int64). More than ``len(slots)`` means the edges were cut
    short: evaluate again wider. Tensor operations only: traceable and compilable."""
    keep, _ = kept_candidates(positions, cell, candidate_index, candidate_shifts, cutoff)
    count = keep.sum()
    width = slots.shape[0]
    rank = torch.cumsum(keep, 0) - 1
    # every candidate not kept (or beyond the width) lands in one spare slot, dropped after
    target = torch.where(keep & (rank < width), rank, width)
    index = candidate_index.new_zeros(2, width + 1)
    index = index.scatter(1, target.expand(2, -1), candidate_index)[:, :width]
    shifts = padding_shift.expand(width + 1, 3).clone()
    shifts = shifts.scatter(0, target[:, None].expand(-1, 3), candidate_shifts)[:width]
    return PaddedEdges(index, shifts, slots < count), count
