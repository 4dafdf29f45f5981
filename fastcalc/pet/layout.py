"""Topology of a PET evaluation: which neighbours every atom sees, packed into a padded grid.

Everything here is integer/bool and gradient-free; the geometry (vectors, distances,
cutoff weights) is recomputed from positions inside :class:`fastcalc.pet.core.PETCore`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..neighbors import neighbor_list
from .cutoffs import adaptive_cutoffs
from .hypers import PETHypers


class PETLayout(NamedTuple):
    """Padded node-edge layout of one structure with n atoms and K = max neighbour count.

    species:   (n,) index of each atom's type in the model's type list
    neighbors: (n, K) neighbour atom of each slot (the atom itself in padded slots)
    shifts:    (n, K, 3) integer cell shift of each slot: vector = r_j - r_i + shift @ cell
    mask:      (n, K) True for real neighbours
    reverse:   (n, K) flat index (into n * K) of the slot holding the reversed edge j -> i;
               padded slots point to themselves
    pool_*:    every pair within the maximal cutoff (centre, neighbour, shift); used to
               recompute adaptive cutoffs differentiably, empty for fixed-cutoff models
    """

    species: torch.Tensor
    neighbors: torch.Tensor
    shifts: torch.Tensor
    mask: torch.Tensor
    reverse: torch.Tensor
    pool_centers: torch.Tensor
    pool_neighbors: torch.Tensor
    pool_shifts: torch.Tensor


def pair_vectors(
    positions: torch.Tensor,
    cell: torch.Tensor,
    centers: torch.Tensor,
    neighbors: torch.Tensor,
    shifts: torch.Tensor,
) -> torch.Tensor:
    """Cartesian vectors r_j - r_i + S @ cell for index tensors of any (broadcastable) shape."""
    return positions[neighbors] - positions[centers] + shifts.to(positions.dtype) @ cell


def pair_distances(vectors: torch.Tensor) -> torch.Tensor:
    """|v| + 1e-15, the distance PET feeds to its adaptive-cutoff solver."""
    return torch.linalg.vector_norm(vectors, dim=-1) + 1e-15


def _reverse_edges(
    centers: torch.Tensor, neighbors: torch.Tensor, shifts: torch.Tensor, num_atoms: int
) -> torch.Tensor:
    """For every edge (i, j, S), the index of the edge (j, i, -S); raises if one is missing."""
    if centers.numel() == 0:
        return centers.clone()
    reach = int(shifts.abs().max())
    base = 2 * reach + 1
    if num_atoms * num_atoms * base**3 >= 2**62:
        raise ValueError("structure too large to index its edges with int64 keys")

    def key(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        s = s + reach
        return (((a * num_atoms + b) * base + s[:, 0]) * base + s[:, 1]) * base + s[:, 2]

    forward_keys, order = torch.sort(key(centers, neighbors, shifts))
    backward_keys = key(neighbors, centers, -shifts)
    where = torch.searchsorted(forward_keys, backward_keys).clamp_max(len(order) - 1)
    if not torch.equal(forward_keys[where], backward_keys):
        raise ValueError("neighbour list is not symmetric: some edge j -> i is missing")
    return order[where]


@torch.no_grad()
def build_layout(
    positions: torch.Tensor,
    cell: torch.Tensor,
    numbers: torch.Tensor,
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    hypers: PETHypers,
    species_index: torch.Tensor,
) -> PETLayout:
    """Pack a full neighbour list (within ``hypers.cutoff``) into a :class:`PETLayout`.

    For adaptive models, the per-atom cutoffs are solved on the current (detached)
    geometry and only pairs with distance <= (r_i + r_j) / 2 are kept in the grid.
    ``species_index`` maps atomic numbers to model type indices (-1: unsupported).
    """
    n = len(numbers)
    device = positions.device
    numbers = numbers.to(device=device, dtype=torch.long)
    known = (numbers < len(species_index)) & (numbers >= 0)
    species = torch.full_like(numbers, -1)
    species[known] = species_index.to(device)[numbers[known]]
    if bool((species < 0).any()):
        bad = sorted(set(numbers[species < 0].tolist()))
        raise ValueError(f"atomic numbers {bad} are not supported by this PET model")

    centers, neighbors = edge_index.to(device=device, dtype=torch.long)
    shifts = unit_shifts.to(device=device, dtype=torch.long)
    empty = torch.zeros(0, dtype=torch.long, device=device)
    pool = (empty, empty, empty.view(0, 3))
    if hypers.num_neighbors_adaptive is not None:
        pool = (centers, neighbors, shifts)
        distances = pair_distances(pair_vectors(positions, cell, centers, neighbors, shifts))
        radii = adaptive_cutoffs(
            centers,
            distances,
            n,
            hypers.num_neighbors_adaptive,
            hypers.cutoff,
            hypers.cutoff_width_adaptive,
        )
        keep = distances <= 0.5 * (radii[centers] + radii[neighbors])
        centers, neighbors, shifts = centers[keep], neighbors[keep], shifts[keep]

    counts = torch.bincount(centers, minlength=n)
    width = int(counts.max()) if centers.numel() > 0 else 0
    order = torch.argsort(centers, stable=True)
    first_slot = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(centers)
    slot[order] = torch.arange(len(order), device=device) - first_slot[centers[order]]
    reverse_edge = _reverse_edges(centers, neighbors, shifts, n)

    grid_neighbors = torch.arange(n, device=device)[:, None].repeat(1, width)
    grid_neighbors[centers, slot] = neighbors
    grid_shifts = torch.zeros(n, width, 3, dtype=torch.long, device=device)
    grid_shifts[centers, slot] = shifts
    mask = torch.zeros(n, width, dtype=torch.bool, device=device)
    mask[centers, slot] = True
    reverse = torch.arange(n * width, device=device).view(n, width)
    reverse[centers, slot] = neighbors * width + slot[reverse_edge]
    return PETLayout(species, grid_neighbors, grid_shifts, mask, reverse, *pool)


def structure_layout(
    positions: torch.Tensor,
    cell: torch.Tensor,
    pbc: Sequence[bool],
    numbers: torch.Tensor,
    hypers: PETHypers,
    species_index: torch.Tensor,
) -> PETLayout:
    """Neighbour list (fastcalc's, ASE convention) + :func:`build_layout` for one structure."""
    positions, cell = positions.detach(), cell.detach()
    pbc = torch.as_tensor(np.asarray(pbc, dtype=bool), device=positions.device)
    edge_index, unit_shifts = neighbor_list(positions, cell, pbc, hypers.cutoff)
    return build_layout(positions, cell, numbers, edge_index, unit_shifts, hypers, species_index)
