"""Topology of a PET evaluation: which neighbours every atom sees, packed into a padded grid.

Two steps. Once per neighbour search, :func:`prepare_candidates` turns the search's
pairs (everything within the cutoff, or within cutoff + skin for a Verlet list) into
:class:`Candidates`: sorted by centre, each with the index of its reversed pair,
padded to a bucket. Every evaluation, :func:`device_layout` picks from the candidates
the edges PET keeps on the current geometry (within the cutoff; for adaptive models,
within the pair's adaptive cutoff) and scatters them into a :class:`PETLayout` of a
given width, with tensor operations only: no host synchronisation and no
data-dependent shape, so it is compiled (and CUDA-graphed) together with the model's
graph, ahead of it (:func:`fastcalc.pet.trace.step_graph`).

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
    pool_*:    candidate pairs (centre, neighbour, shift) including every pair within the
               maximal cutoff; adaptive models recompute their cutoffs from them
               differentiably (pairs beyond the cutoff contribute exactly nothing)
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


class Candidates(NamedTuple):
    """Pairs a layout is picked from; fixed between neighbour searches.

    centers, neighbors, shifts: (P,), (P,), (P, 3) int64 pairs (i, j, S), the real ones
             first and sorted by centre, then padding: self-pairs of atom 0 beyond the cutoff
    reverse: (P,) index of the pair (j, i, -S); padding points to itself
    """

    centers: torch.Tensor
    neighbors: torch.Tensor
    shifts: torch.Tensor
    reverse: torch.Tensor


class Selection(NamedTuple):
    """Which candidates PET keeps on the current geometry.

    keep:   (P,) bool
    counts: (n,) kept pairs per centre
    radii:  (n,) adaptive-cutoff roots, or empty for fixed cutoffs
    """

    keep: torch.Tensor
    counts: torch.Tensor
    radii: torch.Tensor


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


@torch.no_grad()
def prepare_candidates(
    edge_index: torch.Tensor, unit_shifts: torch.Tensor, num_atoms: int
) -> Candidates:
    """A full neighbour list as :class:`Candidates` (unpadded); two host synchronisations.

    Raises ``ValueError`` if some pair's reverse is missing (the list is not symmetric)
    or the list is too large to key its pairs with int64.
    """
    edge_index = edge_index.long()
    shifts = unit_shifts.long()
    order = torch.argsort(edge_index[0], stable=True)
    centers, neighbors, shifts = edge_index[0, order], edge_index[1, order], shifts[order]
    if centers.shape[0] == 0:
        return Candidates(centers, neighbors, shifts, centers.clone())
    reach = int(shifts.abs().max())
    base = 2 * reach + 1
    if num_atoms**2 * base**3 >= 2**62:
        raise ValueError("neighbour list too large to index its edges")

    def key(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        s = s + reach
        return (((a * num_atoms + b) * base + s[:, 0]) * base + s[:, 1]) * base + s[:, 2]

    forward_keys, by_key = torch.sort(key(centers, neighbors, shifts))
    backward_keys = key(neighbors, centers, -shifts)
    where = torch.searchsorted(forward_keys, backward_keys).clamp_max(centers.shape[0] - 1)
    if not bool((forward_keys[where] == backward_keys).all()):
        raise ValueError("neighbour list is not symmetric (some edge j -> i is missing)")
    return Candidates(centers, neighbors, shifts, by_key[where])


def pad_candidates(
    candidates: Candidates, cell: torch.Tensor, cutoff: float, size: int
) -> Candidates:
    """``candidates`` padded to ``size`` pairs with self-pairs of atom 0 beyond ``cutoff``.

    ``cell`` must have no zero vector (see :func:`fastcalc.buckets.padding_cell`).
    """
    real = candidates.centers.shape[0]
    if size < real:
        raise ValueError(f"cannot pad {real} candidate pairs to {size}")
    edge_index = torch.stack([candidates.centers, candidates.neighbors])
    padded = pad_edges(edge_index, candidates.shifts, cell, cutoff, size)
    reverse = torch.cat(
        [candidates.reverse, torch.arange(real, size, device=candidates.reverse.device)]
    )
    return Candidates(*padded.edge_index, padded.unit_shifts, reverse)


@torch.no_grad()
def select_edges(
    positions: torch.Tensor, cell: torch.Tensor, candidates: Candidates, hypers: PETHypers
) -> Selection:
    """The :class:`Selection` of ``candidates`` on the (detached) geometry.

    Kept: pairs shorter than ``hypers.cutoff`` and, for adaptive models, no longer than
    (r_i + r_j) / 2, with the per-atom cutoffs solved on this geometry. Symmetric:
    a pair and its reverse have bitwise equal distances and pair cutoffs.
    """
    positions, cell = positions.detach(), cell.detach()
    n = positions.shape[0]
    centers, neighbors = candidates.centers, candidates.neighbors
    distances = pair_distances(pair_vectors(positions, cell, centers, neighbors, candidates.shifts))
    keep = distances < hypers.cutoff
    radii = positions.new_zeros(0)
    if hypers.num_neighbors_adaptive is not None:
        args = (hypers.num_neighbors_adaptive, hypers.cutoff, hypers.cutoff_width_adaptive)
        radii = solve_adaptive_cutoffs(centers, distances, n, *args)
        cutoffs = implicit_step(radii, centers, distances, *args)
        keep = keep & (distances <= 0.5 * (cutoffs[centers] + cutoffs[neighbors]))
    counts = torch.zeros(n, dtype=torch.long, device=positions.device)
    counts = counts.scatter_add(0, centers, keep.long())
    return Selection(keep, counts, radii)


@torch.no_grad()
def device_layout(
    positions: torch.Tensor,
    cell: torch.Tensor,
    species: torch.Tensor,
    candidates: Candidates,
    slots: torch.Tensor,
    hypers: PETHypers,
) -> tuple[PETLayout, torch.Tensor]:
    """The layout of width K = len(slots) (``slots`` is ``arange(K)``), and its status.

    ``status`` is the int64 pair (largest kept count per atom, 1 if every kept pair's
    reverse is kept else 0). The layout is complete only if that count is at most K;
    with fewer slots it is truncated and must be rebuilt wider. Tensor operations
    only, for any sizes: it can be traced and compiled.
    """
    n, width = positions.shape[0], slots.shape[0]
    centers, neighbors, shifts, reverse = candidates
    selection = select_edges(positions, cell, candidates, hypers)
    keep, counts = selection.keep, selection.counts
    kept_before = torch.cumsum(keep.long(), 0) - keep.long()
    centre_start = torch.cumsum(counts, 0) - counts
    slot = kept_before - centre_start[centers]  # rank among its centre's kept pairs
    placed = keep & (slot < width)
    dump = n * width  # one spare entry receives every pair that is not placed
    flat = torch.where(placed, centers * width + slot, dump)
    spare = torch.arange(dump + 1, device=positions.device)
    own = torch.arange(n, device=positions.device)[:, None].expand(n, width).reshape(-1)

    def scatter(base: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        index = flat.view(-1, *([1] * (values.ndim - 1))).expand_as(values)
        return base.scatter(0, index, values)[:dump]

    grid_neighbors = scatter(torch.cat([own, own.new_zeros(1)]), neighbors).view(n, width)
    grid_shifts = scatter(shifts.new_zeros(dump + 1, 3), shifts).view(n, width, 3)
    grid_reverse = scatter(spare, neighbors * width + slot[reverse]).view(n, width)
    mask = slots[None, :] < counts[:, None]
    symmetric = (~keep | keep[reverse]).all()
    status = torch.stack([counts.max(), symmetric.long()])
    layout = PETLayout(
        species, grid_neighbors, grid_shifts, mask, grid_reverse,
        centers, neighbors, shifts, selection.radii,
    )
    return layout, status


def layout_function(hypers: PETHypers) -> Callable[..., tuple[torch.Tensor, ...]]:
    """:func:`device_layout` on flat tensors, for compiling:
    ``(positions, cell, species, *candidates, slots) -> (*layout, status)``."""

    def run(
        positions: torch.Tensor,
        cell: torch.Tensor,
        species: torch.Tensor,
        centers: torch.Tensor,
        neighbors: torch.Tensor,
        shifts: torch.Tensor,
        reverse: torch.Tensor,
        slots: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        candidates = Candidates(centers, neighbors, shifts, reverse)
        layout, status = device_layout(positions, cell, species, candidates, slots, hypers)
        return (*layout, status)

    return run


def species_of(numbers: torch.Tensor, species_index: torch.Tensor) -> torch.Tensor:
    """Model type index of every atomic number; ``ValueError`` naming unsupported ones."""
    numbers = numbers.long()
    index = species_index.to(numbers.device)
    known = (numbers >= 0) & (numbers < index.shape[0])
    species = index[numbers.clamp(0, index.shape[0] - 1)]
    bad = ~known | (species < 0)
    if bool(bad.any()):
        unsupported = sorted(set(numbers[bad].tolist()))
        raise ValueError(f"atomic numbers {unsupported} are not supported by this PET model")
    return species


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
) -> PETLayout:
    """The :class:`PETLayout` of a full neighbour list (pairs within ``hypers.cutoff`` or more).

    ``shape(atoms, width, pool)`` gives the padded sizes (see
    :func:`fastcalc.pet.padding.padded_shape`); by default none are added. ``cell`` must
    have no zero vector when pool pairs get padded (see
    :func:`fastcalc.buckets.padding_cell`). ``species_index`` maps atomic numbers to
    model type indices (-1: unsupported). Synchronises with the device a few times: for
    repeated evaluations use :func:`device_layout`.
    """
    n = numbers.shape[0]
    device = positions.device
    species = species_of(numbers.to(device), species_index)
    candidates = prepare_candidates(edge_index.to(device), unit_shifts.to(device), n)
    width = int(select_edges(positions, cell, candidates, hypers).counts.max()) if n else 0
    pairs = candidates.centers.shape[0]
    padded = shape(n, width, pairs)
    if padded.atoms < n or padded.width < width or padded.pool < pairs:
        raise ValueError(f"cannot pad a layout of {n} atoms x {width} slots to {tuple(padded)}")
    extra = padded.atoms - n
    positions = torch.cat([positions, positions.new_zeros(extra, 3)])
    species = torch.cat([species, species.new_zeros(extra)])
    if padded.pool > pairs:
        candidates = pad_candidates(candidates, cell, hypers.cutoff, padded.pool)
    slots = torch.arange(padded.width, device=device)
    layout, status = device_layout(positions, cell, species, candidates, slots, hypers)
    if not bool(status[1]):
        raise ValueError("the kept edges are not symmetric")
    return layout


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
