"""Topology of a PET evaluation: which neighbours every atom sees, packed into a padded grid.

Two steps. Once per neighbour search, :func:`prepare_candidates` turns the search's
pairs (everything within the cutoff, or within cutoff + skin for a Verlet list) into
:class:`Candidates`: one row per centre atom, each pair with the index of its reversed
pair, padded to a bucket (:func:`pad_candidates`). Every evaluation, :func:`device_layout` picks from the candidates
the edges PET keeps on the current geometry (within the cutoff; for adaptive models,
within the pair's adaptive cutoff) and scatters them into a :class:`PETLayout` of a
given width, with tensor operations only: no host synchronisation and no
data-dependent shape, so it is compiled (and CUDA-graphed) together with the model's
graph, ahead of it (:class:`fastcalc.pet.trace.StepGraph`).

Everything here is integer/bool and gradient-free; the geometry (vectors, distances,
cutoff weights) is recomputed from positions inside :class:`fastcalc.pet.core.PETCore`.

A batch of structures is one layout of their concatenated atoms: ``cell`` is then
(n, 3, 3), each atom's own structure's cell, wherever a (3, 3) cell is taken here, so
that every pair's shift is applied with its centre's cell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..buckets import padding_cell, padding_shift
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
    pool_*:    (n, R) neighbours and (n, R, 3) shifts of the candidate pairs, one row per
               centre, including every pair within the maximal cutoff; adaptive models
               recompute their cutoffs from them differentiably (pairs beyond the cutoff,
               the padding included, contribute exactly nothing)
    radii:     (n,) detached root of the adaptive-cutoff equation on this geometry (see
               :func:`fastcalc.pet.cutoffs.solve_adaptive_cutoffs`); empty for fixed cutoffs
    """

    species: torch.Tensor
    neighbors: torch.Tensor
    shifts: torch.Tensor
    mask: torch.Tensor
    reverse: torch.Tensor
    pool_neighbors: torch.Tensor
    pool_shifts: torch.Tensor
    radii: torch.Tensor


class Candidates(NamedTuple):
    """Pairs a layout is picked from, one row per centre atom; fixed between neighbour searches.

    neighbors: (n, R) int64 neighbour atom of each candidate pair (i, j, S)
    shifts:    (n, R, 3) int64 cell shift S
    reverse:   (n, R) flat index (into n * R) of the pair (j, i, -S)

    Each row holds its centre's pairs first; the rest of the row, and every row of a
    padded atom, is padding: the centre itself at a shift beyond the cutoff
    (:func:`fastcalc.buckets.padding_shift`), its own reverse. Rows let every per-atom
    sum be a row reduction rather than a scatter.
    """

    neighbors: torch.Tensor
    shifts: torch.Tensor
    reverse: torch.Tensor


class Selection(NamedTuple):
    """Which candidates PET keeps on the current geometry.

    keep:   (n, R) bool
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
    """Cartesian vectors r_j - r_i + S @ cell for index tensors of any (broadcastable) shape;
    ``cell`` (3, 3), or (n, 3, 3) per centre for ``shifts`` (n, R, 3) of n centres."""
    return positions[neighbors] - positions[centers] + shifts.to(positions.dtype) @ cell


def pair_distances(vectors: torch.Tensor) -> torch.Tensor:
    """|v| + 1e-15, the distance PET feeds to its adaptive-cutoff solver."""
    return torch.linalg.vector_norm(vectors, dim=-1) + 1e-15


def candidate_distances(
    positions: torch.Tensor, cell: torch.Tensor, neighbors: torch.Tensor, shifts: torch.Tensor
) -> torch.Tensor:
    """(n, R) distances of candidate rows (centre i of row i)."""
    centers = torch.arange(neighbors.shape[0], device=neighbors.device)[:, None]
    return pair_distances(pair_vectors(positions, cell, centers, neighbors, shifts))


def _padding_rows(
    atoms: int, columns: int, cell: torch.Tensor, cutoff: float
) -> Candidates:
    """Candidates of ``atoms`` rows x ``columns`` holding padding only (``cell`` (3, 3), or
    (atoms, 3, 3): each row padded along its own cell)."""
    device = cell.device
    own = torch.arange(atoms, device=device)[:, None].expand(atoms, columns).clone()
    shifts = padding_shift(cell, cutoff).view(-1, 1, 3).expand(atoms, columns, 3).clone()
    reverse = torch.arange(atoms * columns, device=device).view(atoms, columns)
    return Candidates(own, shifts, reverse)


@torch.no_grad()
def prepare_candidates(
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    num_atoms: int,
    cell: torch.Tensor,
    cutoff: float,
) -> Candidates:
    """A full neighbour list as :class:`Candidates` with one row per atom and as many
    columns as the largest row needs; two host synchronisations.

    ``cell`` (no zero vector, see :func:`fastcalc.buckets.padding_cell`) and ``cutoff``
    place the padding. Raises ``ValueError`` if some pair's reverse is missing (the list
    is not symmetric) or the list is too large to key its pairs with int64.
    """
    edge_index = edge_index.long()
    shifts = unit_shifts.long()
    order = torch.argsort(edge_index[0], stable=True)
    centers, neighbors, shifts = edge_index[0, order], edge_index[1, order], shifts[order]
    pairs = centers.shape[0]
    counts = torch.bincount(centers, minlength=num_atoms)
    columns = int(counts.max()) if pairs else 0
    grid = _padding_rows(num_atoms, columns, cell, cutoff)
    if pairs == 0:
        return grid
    reach = int(shifts.abs().max())
    base = 2 * reach + 1
    if num_atoms**2 * base**3 >= 2**62:
        raise ValueError("neighbour list too large to index its edges")

    def key(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        s = s + reach
        return (((a * num_atoms + b) * base + s[:, 0]) * base + s[:, 1]) * base + s[:, 2]

    forward_keys, by_key = torch.sort(key(centers, neighbors, shifts))
    backward_keys = key(neighbors, centers, -shifts)
    where = torch.searchsorted(forward_keys, backward_keys).clamp_max(pairs - 1)
    if not bool((forward_keys[where] == backward_keys).all()):
        raise ValueError("neighbour list is not symmetric (some edge j -> i is missing)")
    rank = torch.arange(pairs, device=centers.device) - (torch.cumsum(counts, 0) - counts)[centers]
    flat = centers * columns + rank
    return Candidates(
        grid.neighbors.view(-1).index_put((flat,), neighbors).view_as(grid.neighbors),
        grid.shifts.view(-1, 3).index_put((flat,), shifts).view_as(grid.shifts),
        grid.reverse.view(-1).index_put((flat,), flat[by_key[where]]).view_as(grid.reverse),
    )


def pad_candidates(
    candidates: Candidates, cell: torch.Tensor, cutoff: float, atoms: int, columns: int
) -> Candidates:
    """``candidates`` padded to ``atoms`` rows and ``columns`` columns (see :class:`Candidates`)."""
    n, real = candidates.neighbors.shape
    if atoms < n or columns < real:
        raise ValueError(f"cannot pad {n} x {real} candidates to {atoms} x {columns}")
    grid = _padding_rows(atoms, columns, cell, cutoff)
    grid.neighbors[:n, :real] = candidates.neighbors
    grid.shifts[:n, :real] = candidates.shifts
    if real:
        old = candidates.reverse
        grid.reverse[:n, :real] = old // real * columns + old % real
    return grid


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
    neighbors = candidates.neighbors
    distances = candidate_distances(positions, cell, neighbors, candidates.shifts)
    keep = distances < hypers.cutoff
    radii = positions.new_zeros(0)
    if hypers.num_neighbors_adaptive is not None:
        args = (hypers.num_neighbors_adaptive, hypers.cutoff, hypers.cutoff_width_adaptive)
        radii = solve_adaptive_cutoffs(distances, *args)
        cutoffs = implicit_step(radii, distances, *args)
        keep = keep & (distances <= 0.5 * (cutoffs[:, None] + cutoffs[neighbors]))
    return Selection(keep, keep.sum(dim=1), radii)


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
    neighbors, shifts, reverse = candidates
    selection = select_edges(positions, cell, candidates, hypers)
    keep, counts = selection.keep, selection.counts
    kept = keep.long()
    slot = torch.cumsum(kept, dim=1) - kept  # rank among its centre's kept pairs
    placed = keep & (slot < width)
    dump = n * width  # one spare entry receives every pair that is not placed
    own = torch.arange(n, device=positions.device)
    flat = torch.where(placed, own[:, None] * width + slot, dump).view(-1)
    spare = torch.arange(dump + 1, device=positions.device)
    own_slots = own[:, None].expand(n, width).reshape(-1)

    def scatter(base: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        values = values.reshape(flat.shape[0], *values.shape[2:])
        index = flat.view(-1, *([1] * (values.ndim - 1))).expand_as(values)
        return base.scatter(0, index, values)[:dump]

    grid_neighbors = scatter(torch.cat([own_slots, own.new_zeros(1)]), neighbors).view(n, width)
    grid_shifts = scatter(shifts.new_zeros(dump + 1, 3), shifts).view(n, width, 3)
    reverse_slot = slot.view(-1)[reverse]
    grid_reverse = scatter(spare, neighbors * width + reverse_slot).view(n, width)
    mask = slots[None, :] < counts[:, None]
    symmetric = (~keep | keep.view(-1)[reverse]).all()
    status = torch.stack([counts.max(), symmetric.long()])
    layout = PETLayout(
        species, grid_neighbors, grid_shifts, mask, grid_reverse, neighbors, shifts,
        selection.radii,
    )
    return layout, status


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
def sized_candidates(
    positions: torch.Tensor,
    cell: torch.Tensor,
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    hypers: PETHypers,
    shape: ShapeRule = exact_shape,
    width: int | None = None,
) -> tuple[Candidates, PaddedShape]:
    """A full neighbour list as :class:`Candidates` padded to ``shape(atoms, width,
    columns)``, and that padded shape. ``width`` defaults to the largest kept count on
    this geometry, which for adaptive cutoffs takes their solve on the host (hundreds of
    small operations); a given ``width`` is taken as it is. A padded width narrower than
    the largest kept count gives a truncated layout, which :func:`device_layout`'s status
    reports. Once per neighbour search: it synchronises with the device a few times.

    ``cell`` must have no zero vector (see :func:`fastcalc.buckets.padding_cell`).
    """
    n = positions.shape[0]
    candidates = prepare_candidates(edge_index, unit_shifts, n, cell, hypers.cutoff)
    if width is None:
        width = int(select_edges(positions, cell, candidates, hypers).counts.max()) if n else 0
    columns = candidates.neighbors.shape[1]
    padded = shape(n, width, columns)
    return pad_candidates(candidates, cell, hypers.cutoff, padded.atoms, padded.pool), padded


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

    ``shape(atoms, width, pool)`` gives the padded sizes, ``pool`` being the candidate
    columns (see :func:`fastcalc.pet.padding.padded_shape`); by default none are added.
    ``cell`` must have no zero vector (see :func:`fastcalc.buckets.padding_cell`), and
    the model must be given the same. ``species_index`` maps atomic numbers to model
    type indices (-1: unsupported). Synchronises with the device a few times: for
    repeated evaluations use :func:`device_layout`.
    """
    n = numbers.shape[0]
    device = positions.device
    species = species_of(numbers.to(device), species_index)
    candidates, padded = sized_candidates(
        positions, cell, edge_index.to(device), unit_shifts.to(device), hypers, shape
    )
    extra = padded.atoms - n
    positions = torch.cat([positions, positions.new_zeros(extra, 3)])
    species = torch.cat([species, species.new_zeros(extra)])
    slots = torch.arange(padded.width, device=device)
    layout, status = device_layout(positions, cell, species, candidates, slots, hypers)
    needed, symmetric = status.tolist()
    if needed > padded.width:
        raise ValueError(f"cannot pad a layout of {n} atoms x {needed} slots to {tuple(padded)}")
    if not symmetric:
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
    """Neighbour list (fastcalc's, ASE convention) + :func:`build_layout` for one structure.

    The layout is built for ``padding_cell(cell, hypers.cutoff)``, the cell the model
    must then be given (as :func:`fastcalc.pet.energy.evaluate` does).
    """
    positions, cell = positions.detach(), cell.detach()
    pbc = torch.as_tensor(np.asarray(pbc, dtype=bool), device=positions.device)
    edge_index, unit_shifts = neighbor_list(positions, cell, pbc, hypers.cutoff)
    return build_layout(
        positions, padding_cell(cell, hypers.cutoff), numbers, edge_index, unit_shifts, hypers,
        species_index,
    )
