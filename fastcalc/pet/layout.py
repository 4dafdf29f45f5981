"""Topology of a PET evaluation: which neighbours every atom sees, packed into a padded grid.

Everything here is integer/bool and gradient-free; the geometry (vectors, distances,
cutoff weights) is recomputed from positions inside :class:`fastcalc.pet.core.PETCore`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..buckets import pad_edges
from ..neighbors import neighbor_list
from .cutoffs import implicit_step, solve_adaptive_cutoffs
from .hypers import PETHypers
from .padding import PaddedShape


class PETLayout(NamedTuple):
    """Padded node-edge layout of one structure with n atoms and K neighbour slots per atom.

    species:   (n,) index of each atom's type in the model's type list
    neighbors: (n, K) neighbour atom of each slot (the atom itself in padded slots)
    shifts:    (n, K, 3) integer cell shift of each slot: vector = r_j - r_i + shift @ cell
    mask:      (n, K) True for real neighbours
    reverse:   (n, K) flat index (into n * K) of the slot holding the reversed edge j -> i;
               padded slots point to themselves
    pool_*:    every pair within the maximal cutoff (centre, neighbour, shift); used to
               recompute adaptive cutoffs differentiably, empty for fixed-cutoff models
    radii:     (n,) detached root of the adaptive-cutoff equation on this geometry (see
               :func:`fastcalc.pet.cutoffs.solve_adaptive_cutoffs`); empty for fixed cutoffs
    """

    species: torch.Tensor
    neighbors: torch.Tensor
    shifts: torch.Tensor
    mask: torch.Tensor
    reverse: torch.Tensor
    pool_centers: torch.Tensor
    pool_neighbors: torch.Tensor
    pool_shifts: torch.Tensor
    radii: torch.Tensor


class EdgeSelection(NamedTuple):
    """Which edges of a full neighbour list a PET layout keeps, from tensors alone.

    keep:    (E,) bool, the edges inside the pair cutoff (all of them for fixed cutoffs)
    counts:  (n,) kept edges per centre
    reverse: (E,) index of the reversed edge (j, i, -S) of every edge
    radii:   (n,) adaptive-cutoff roots, or empty
    valid:   () bool, False if the list is not symmetric or too large for int64 keys
    """

    keep: torch.Tensor
    counts: torch.Tensor
    reverse: torch.Tensor
    radii: torch.Tensor
    valid: torch.Tensor


ShapeRule = Callable[[int, int, int], PaddedShape]


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every edge (i, j, S), the index of the edge (j, i, -S), and whether all exist.

    Edges are keyed by one int64 built from (i, j, S); no host synchronisation.
    """
    reach = shifts.abs().max()
    base = 2 * reach + 1
    fits = float(num_atoms) ** 2 * base.double() ** 3 < 2.0**62

    def key(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        s = s + reach
        return (((a * num_atoms + b) * base + s[:, 0]) * base + s[:, 1]) * base + s[:, 2]

    forward_keys, order = torch.sort(key(centers, neighbors, shifts))
    backward_keys = key(neighbors, centers, -shifts)
    where = torch.searchsorted(forward_keys, backward_keys).clamp_max(centers.shape[0] - 1)
    found = (forward_keys[where] == backward_keys).all()
    return order[where], found & fits


def select_edges(
    positions: torch.Tensor,
    cell: torch.Tensor,
    centers: torch.Tensor,
    neighbors: torch.Tensor,
    shifts: torch.Tensor,
    hypers: PETHypers,
) -> EdgeSelection:
    """The :class:`EdgeSelection` of a non-empty full neighbour list within ``hypers.cutoff``.

    For adaptive models, the per-atom cutoffs are solved on the (detached) geometry and
    an edge is kept if its distance is at most (r_i + r_j) / 2. Free of host
    synchronisation and data-dependent shapes, so it can be compiled.
    """
    n = positions.shape[0]
    reverse, valid = _reverse_edges(centers, neighbors, shifts, n)
    radii = positions.new_zeros(0)
    keep = torch.ones_like(centers, dtype=torch.bool)
    if hypers.num_neighbors_adaptive is not None:
        distances = pair_distances(pair_vectors(positions, cell, centers, neighbors, shifts))
        args = (hypers.num_neighbors_adaptive, hypers.cutoff, hypers.cutoff_width_adaptive)
        radii = solve_adaptive_cutoffs(centers, distances, n, *args)
        cutoffs = implicit_step(radii, centers, distances, *args)
        keep = distances <= 0.5 * (cutoffs[centers] + cutoffs[neighbors])
    counts = torch.zeros(n, dtype=torch.long, device=positions.device)
    counts = counts.scatter_add(0, centers, keep.long())
    return EdgeSelection(keep, counts, reverse, radii, valid)


def exact_shape(atoms: int, width: int, pool: int) -> PaddedShape:
    """No padding."""
    return PaddedShape(atoms, width, pool)


@torch.no_grad()
def build_layout(
    positions: torch.Tensor,
    cell: torch.Tensor,
    numbers: torch.Tensor,
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    hypers: PETHypers,
    species_index: torch.Tensor,
    *,
    shape: ShapeRule = exact_shape,
    select: Callable[..., EdgeSelection] = select_edges,
) -> PETLayout:
    """Pack a full neighbour list (within ``hypers.cutoff``) into a :class:`PETLayout`.

    ``shape(atoms, width, pool)`` gives the padded sizes (see
    :func:`fastcalc.pet.padding.padded_shape`); by default none are added.
    ``cell`` must have no zero vector when pool pairs get padded (see
    :func:`fastcalc.buckets.padding_cell`). ``select`` is :func:`select_edges` or a
    compiled version of it. One host synchronisation reads the layout's sizes.
    ``species_index`` maps atomic numbers to model type indices (-1: unsupported).
    """
    n = numbers.shape[0]
    device = positions.device
    numbers = numbers.to(device=device, dtype=torch.long)
    index = species_index.to(device)
    known = (numbers >= 0) & (numbers < index.shape[0])
    species = index[numbers.clamp(0, index.shape[0] - 1)]
    supported = (known & (species >= 0)).all()
    edge_index = edge_index.to(device=device, dtype=torch.long)
    shifts = unit_shifts.to(device=device, dtype=torch.long)
    centers, neighbors = edge_index
    if centers.shape[0] > 0:
        selection = select(positions, cell, centers, neighbors, shifts, hypers)
    else:
        selection = _no_edges(positions, hypers)
    sizes = torch.stack(
        [selection.keep.sum(), selection.counts.max(), selection.valid.long(), supported.long()]
    )
    kept, width, valid, supported = sizes.tolist()
    if not supported:
        bad = sorted(set(numbers[~known | (species < 0)].tolist()))
        raise ValueError(f"atomic numbers {bad} are not supported by this PET model")
    if not valid:
        raise ValueError("neighbour list is not symmetric (some edge j -> i is missing) "
                         "or too large to index its edges")
    adaptive = hypers.num_neighbors_adaptive is not None
    pairs = centers.shape[0] if adaptive else 0
    padded = shape(n, width, pairs)
    if padded.atoms < n or padded.width < width or padded.pool < pairs:
        raise ValueError(f"cannot pad a layout of {n} atoms x {width} slots to {tuple(padded)}")
    grid = _grid(centers, neighbors, shifts, selection, kept, padded)
    padded_species = species.new_zeros(padded.atoms)
    padded_species[:n] = species
    pool = centers.new_zeros(0), centers.new_zeros(0), shifts.new_zeros(0, 3)
    radii = selection.radii
    if adaptive:
        pool = centers, neighbors, shifts
        if padded.pool > pairs:
            edges = pad_edges(edge_index, shifts, cell, hypers.cutoff, padded.pool)
            pool = edges.edge_index[0], edges.edge_index[1], edges.unit_shifts
        radii = torch.cat([radii, radii.new_full((padded.atoms - n,), hypers.cutoff)])
    return PETLayout(padded_species, *grid, *pool, radii)


def _no_edges(positions: torch.Tensor, hypers: PETHypers) -> EdgeSelection:
    """The selection of an empty neighbour list (isolated atoms)."""
    n = positions.shape[0]
    empty = torch.zeros(0, dtype=torch.long, device=positions.device)
    radii = positions.new_zeros(0)
    if hypers.num_neighbors_adaptive is not None:
        radii = solve_adaptive_cutoffs(
            empty, positions.new_zeros(0), n, hypers.num_neighbors_adaptive, hypers.cutoff,
            hypers.cutoff_width_adaptive,
        )
    counts = torch.zeros(n, dtype=torch.long, device=positions.device)
    valid = torch.ones((), dtype=torch.bool, device=positions.device)
    return EdgeSelection(empty.bool(), counts, empty, radii, valid)


def _grid(
    centers: torch.Tensor,
    neighbors: torch.Tensor,
    shifts: torch.Tensor,
    selection: EdgeSelection,
    kept: int,
    shape: PaddedShape,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(neighbors, shifts, mask, reverse) grids of ``shape`` holding the kept edges."""
    atoms, width, device = shape.atoms, shape.width, centers.device
    # kept edges first, grouped by centre in their original order
    order = torch.argsort(torch.where(selection.keep, centers, atoms), stable=True)[:kept]
    center, neighbor = centers[order], neighbors[order]
    first_slot = torch.cumsum(selection.counts, 0) - selection.counts
    slot = torch.arange(kept, device=device) - first_slot[center]
    rank = torch.zeros_like(centers)
    rank[order] = torch.arange(kept, device=device)
    reverse_rank = rank[selection.reverse[order]]

    grid_neighbors = torch.arange(atoms, device=device)[:, None].repeat(1, width)
    grid_neighbors[center, slot] = neighbor
    grid_shifts = shifts.new_zeros(atoms, width, 3)
    grid_shifts[center, slot] = shifts[order]
    mask = torch.zeros(atoms, width, dtype=torch.bool, device=device)
    mask[center, slot] = True
    reverse = torch.arange(atoms * width, device=device).view(atoms, width)
    reverse[center, slot] = neighbor * width + slot[reverse_rank]
    return grid_neighbors, grid_shifts, mask, reverse


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
