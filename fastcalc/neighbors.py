"""Neighbor lists on nvalchemiops, in ASE's ``neighbor_list("ijS")`` convention.

An edge ``(i, j, S)`` stands for the vector ``positions[j] - positions[i] + S @ cell``
with ``i`` the centre atom. :func:`neighbor_list` returns exactly the multiset of
edges that ASE returns, for one system or a batch of systems, on CPU or CUDA.
:class:`VerletNeighborList` adds a Verlet skin so that the search runs only when
atoms have moved far enough to matter.

One system is searched with nvalchemiops' cell list built by its Warp launcher and
queried through its eager atom-centric path (:func:`_cell_list`), a batch through its torch
``neighbor_list``: the first call of a torch custom operator, such as that function's,
imports torch's compiler, which a calculator's first, uncompiled result need not wait for.

Given ``max_neighbors``, a search is refused before it runs when an estimate made from
the cell and the atoms' density (:func:`estimate_crowding`) shows a geometry no real
structure has (wrong units, a nearly degenerate cell), and after it when an atom has
more neighbours than that; both raise :class:`NeighborOverflowError`.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

from .buckets import check_positive_int
from .nvalchemiops_import import import_neighbor_list
from .stderr_filter import NO_CUDA_DRIVER_NOTICE, dropping_stderr_lines

with dropping_stderr_lines(NO_CUDA_DRIVER_NOTICE):  # warp's notice on CPU-only machines
    _nvalchemi_neighbor_list = import_neighbor_list()

import warp as wp  # noqa: E402  (nvalchemiops first: it keeps warp's notices quiet)
from nvalchemiops.neighbors import build_cell_list  # noqa: E402
from nvalchemiops.torch.neighbors.cell_list import (  # noqa: E402
    estimate_cell_list_sizes, query_cell_list,
)
from nvalchemiops.torch.neighbors.neighbor_utils import allocate_cell_list  # noqa: E402
from nvalchemiops.torch.types import (  # noqa: E402
    get_wp_dtype, get_wp_mat_dtype, get_wp_vec_dtype,
)

__all__ = [
    "MAX_DENSITY",
    "MAX_IMAGES",
    "Crowding",
    "HostGeometry",
    "NeighborOverflowError",
    "VerletNeighborList",
    "estimate_crowding",
    "neighbor_list",
]

#: Initial per-atom width of the neighbor matrix; widened on demand.
_INITIAL_WIDTH = 64
#: The neighbor matrix is widened in steps of this many columns.
_WIDTH_STEP = 16
#: Atoms per Å³ beyond which a search is refused before it runs: the densest solids have
#: under 0.2 and hydrogen compressed to 500 GPa about 0.7, so only wrong units or piled-up
#: atoms get there (and such a search can end out of memory).
MAX_DENSITY = 2.0
#: Periodic images of each atom beyond which a search is refused before it runs: a cell
#: with heights that small next to the cutoff is nearly degenerate, and the search would
#: hang visiting them (sensible cells need at most a few thousand).
MAX_IMAGES = 100_000
#: The estimated neighbours per atom are a mean: a crystal's true count can fall short of it
#: by a shell of neighbours, a thin slab's by a layer, so before searching only an estimate
#: this many times ``max_neighbors`` is refused (the search itself checks the exact count).
_ESTIMATE_MARGIN = 2.0
#: How far (Å) an atom reaches beyond its centre along a non-periodic axis, for the density
#: of the region the atoms occupy: a lone atom, a flat or linear molecule still fill some.
_ATOM_REACH = 1.0


class NeighborOverflowError(ValueError):
    """An atom has more neighbours than the configured limit (usually: wrong units)."""


def neighbor_list(
    positions: torch.Tensor,
    cell: torch.Tensor,
    pbc: torch.Tensor,
    cutoff: float,
    *,
    system_index: torch.Tensor | None = None,
    max_neighbors: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All pairs closer than ``cutoff``, as ``(edge_index, unit_shifts)``.

    ``positions`` is ``(N, 3)``; ``cell`` ``(3, 3)`` or ``(B, 3, 3)``; ``pbc`` ``(3,)``
    or ``(B, 3)``; ``system_index`` ``(N,)`` gives each atom's system (sorted,
    ``None`` for a single system). Returns int64 ``edge_index`` ``(2, E)`` (row 0
    the centre ``i``, row 1 the neighbour ``j``, global atom indices) and int64
    ``unit_shifts`` ``(E, 3)``. Cell vectors along non-periodic axes may be zero.
    Raises :class:`NeighborOverflowError` if an atom has more than
    ``max_neighbors`` neighbours, or, before searching, if :func:`estimate_crowding`
    finds a system far beyond that (see :data:`MAX_DENSITY` and :data:`MAX_IMAGES`).
    """
    return _search(positions, cell, pbc, cutoff, system_index, _INITIAL_WIDTH, max_neighbors)[:2]


def _search(
    positions: torch.Tensor,
    cell: torch.Tensor,
    pbc: torch.Tensor,
    cutoff: float,
    system_index: torch.Tensor | None,
    width: int,
    max_neighbors: int | None,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The search behind :func:`neighbor_list`; also returns the matrix width it used and
    the most neighbours any one atom has."""
    n_atoms = positions.shape[0]
    device = positions.device
    if n_atoms == 0:
        empty = torch.zeros((2, 0), dtype=torch.long, device=device)
        return empty, empty.new_zeros((0, 3)), width, 0
    batched = cell.ndim == 3
    # Warp searches in one dtype: the positions' (a float64 cell from ASE is common)
    cells = (cell if batched else cell.unsqueeze(0)).to(positions.dtype)
    pbcs = (pbc if batched else pbc.unsqueeze(0)).to(device=device, dtype=torch.bool)
    if system_index is None:
        system_index = torch.zeros(n_atoms, dtype=torch.long, device=device)
    # one host copy of the cells for both host-side steps
    host_cells, host_pbcs = cells.detach().cpu().double().numpy(), pbcs.cpu().numpy()
    search_cells = _search_cells(positions, cells, host_cells, host_pbcs, system_index, cutoff)
    if max_neighbors is not None:
        _refuse_crowded(positions, host_cells, host_pbcs, system_index, cutoff, max_neighbors)
    if batched:
        counts = torch.bincount(system_index, minlength=cells.shape[0])
        ptr = torch.zeros(cells.shape[0] + 1, dtype=torch.int32, device=device)
        ptr[1:] = torch.cumsum(counts, 0)
        search = partial(_nvalchemi_neighbor_list, positions, cutoff, method="cell_list",
                         cell=search_cells, pbc=pbcs, batch_idx=system_index.to(torch.int32),
                         batch_ptr=ptr)
    else:
        search = partial(_cell_list, positions, search_cells, pbcs[0], cutoff)
    while True:
        matrix, counts, shifts = search(max_neighbors=width)
        needed = int(counts.max())
        if max_neighbors is not None and needed > max_neighbors:
            atom = int(torch.argmax(counts))
            raise NeighborOverflowError(
                f"atom {atom} has {needed} neighbours within {cutoff:g} Å, more than the "
                f"limit of {max_neighbors}: are the positions in Å and the atoms not overlapping?"
            )
        if needed <= width:
            break
        # nvalchemiops fills at most `width` columns but counts every neighbour: widen, retry.
        width = _WIDTH_STEP * math.ceil(needed / _WIDTH_STEP)
    real = torch.arange(matrix.shape[1], device=device) < counts.unsqueeze(1)
    centres = torch.arange(n_atoms, device=device).unsqueeze(1).expand_as(matrix)
    edge_index = torch.stack([centres[real], matrix[real].long()])
    return edge_index, shifts[real].long(), width, needed


def _cell_list(
    positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, cutoff: float,
    max_neighbors: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nvalchemiops' cell list search of one system (``cell`` (1, 3, 3)): its neighbor
    matrix ``(N, max_neighbors)``, counts ``(N,)`` and shifts ``(N, max_neighbors, 3)``,
    as its ``cell_list`` gives them.

    Built with nvalchemiops' Warp launcher and queried atom by atom (its query's eager
    path), so no torch custom operator runs: the first call of one imports torch's
    compiler (dynamo, a second or more of a fresh process), which a calculator's first
    result, run uncompiled, would otherwise wait for.
    """
    positions, cell = positions.detach(), cell.detach()  # Warp would give them gradients
    atoms, device = positions.shape[0], positions.device
    cell_count, radius = estimate_cell_list_sizes(cell, pbc, cutoff, min_cells_per_dimension=1)
    cells = allocate_cell_list(atoms, cell_count, radius, device)
    matrix = torch.empty((atoms, max_neighbors), dtype=torch.int32, device=device)
    shifts = torch.empty((atoms, max_neighbors, 3), dtype=torch.int32, device=device)
    counts = torch.zeros(atoms, dtype=torch.int32, device=device)
    per_axis, _, atom_shifts, atom_cells, per_cell, starts, by_cell = cells
    dtype = get_wp_dtype(positions.dtype)
    stream = (wp.ScopedStream(wp.stream_from_torch(torch.cuda.current_stream(device)),
                              sync_enter=False)
              if device.type == "cuda" else nullcontext())
    with stream:
        per_cell.zero_()
        build_cell_list(
            wp.from_torch(positions, dtype=get_wp_vec_dtype(positions.dtype)),
            wp.from_torch(cell, dtype=get_wp_mat_dtype(positions.dtype)),
            wp.from_torch(pbc, dtype=wp.bool), cutoff,
            wp.from_torch(per_axis, dtype=wp.int32), wp.from_torch(atom_shifts, dtype=wp.vec3i),
            wp.from_torch(atom_cells, dtype=wp.vec3i), wp.from_torch(per_cell, dtype=wp.int32),
            wp.from_torch(starts, dtype=wp.int32), wp.from_torch(by_cell, dtype=wp.int32),
            dtype, str(device), min_cells_per_dimension=1,
        )
    query_cell_list(positions, cutoff, cell, pbc, *cells, matrix, shifts, counts,
                    strategy="atom_centric", atom_centric_path="direct")
    return matrix, counts, shifts


def _search_cells(
    positions: torch.Tensor,
    cells: torch.Tensor,
    host_cells: np.ndarray,
    host_pbcs: np.ndarray,
    system_index: torch.Tensor,
    cutoff: float,
) -> torch.Tensor:
    """Cells nvalchemiops can search: non-periodic vectors replaced by long normals.

    Shifts along a non-periodic axis are always zero, so that axis's cell vector
    never enters an edge vector; it only needs to be non-degenerate and long
    enough that the search bins stay sensible. It is replaced by a unit vector
    normal to the periodic vectors, as long as the system's extent plus the cutoff.
    ``host_cells`` (float64) and ``host_pbcs`` are host copies of ``cells`` and their pbc.
    """
    replaced = host_cells.copy()
    # fully periodic cells only need checking, and only those that may be degenerate
    periodic = host_pbcs.all(axis=1)
    for s in np.flatnonzero(~periodic | _maybe_degenerate(host_cells)):
        cell, pbc = host_cells[s], host_pbcs[s]
        normals = _complement(cell[pbc])
        if not len(normals):
            continue
        coords = positions.detach()[system_index == s].cpu().double().numpy()
        for axis, normal in zip(np.flatnonzero(~pbc), normals):
            extent = float(np.ptp(coords @ normal)) if len(coords) else 0.0
            replaced[s, axis] = normal * (extent + cutoff + 1.0)
    if periodic.all():
        return cells.detach()
    return torch.from_numpy(replaced).to(cells)


def _maybe_degenerate(cells: np.ndarray) -> np.ndarray:
    """Which of ``cells`` (B, 3, 3) may have linearly dependent vectors by
    :func:`_complement`'s test: a volume of at most 1e-8 times the product of the vectors'
    lengths (every cell that test refuses, and some it accepts)."""
    lengths = np.linalg.norm(cells, axis=2).prod(axis=1)
    return ~(np.abs(np.linalg.det(cells)) > 1e-8 * lengths)


def _complement(periodic: np.ndarray) -> np.ndarray:
    """Orthonormal vectors (rows) normal to the span of the ``periodic`` cell vectors
    (rows, float64); raises ``ValueError`` if those are zero or linearly dependent."""
    basis: list[np.ndarray] = []
    for v in [*periodic, *np.eye(3)]:
        if len(basis) == 3:
            break
        w = v.copy()
        for u in basis:
            w -= (v @ u) * u
        length = math.sqrt(w @ w)
        independent = length > 1e-8 * max(math.sqrt(v @ v), 1e-300)
        if len(basis) < len(periodic) and not independent:
            raise ValueError(
                "the cell vectors of the periodic axes are zero or linearly dependent: "
                f"{periodic.tolist()}"
            )
        if independent:
            basis.append(w / length)
    return np.array(basis[len(periodic):]).reshape(-1, 3)


class Crowding(NamedTuple):
    """What a search within ``radius`` would meet in one system, estimated before it runs
    (:func:`estimate_crowding`)."""

    neighbors: float  # mean neighbours per atom: density times the sphere's volume
    density: float  # atoms per Å³ of the region the atoms occupy (their extent + _ATOM_REACH)
    heights: tuple[float, ...]  # the cell's heights along its periodic axes, Å
    images: float  # periodic images of each atom the search visits


def estimate_crowding(
    positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, radius: float
) -> Crowding:
    """Neighbours per atom within ``radius``, density, cell heights and periodic images of
    one system, from its cell and the atoms' extent, without searching.

    The region the atoms occupy is the cell along periodic axes and, along the others, the
    atoms' extent and ``_ATOM_REACH`` beyond it on each side: the density is theirs. For the
    neighbours that extent is widened to at least ``2 * radius`` instead; the mean density
    of that region times the sphere's volume is the mean count of a uniform system. Real
    structures have about that many (crystals: within a shell of neighbours) or fewer
    (vacuum lowers the density; an extent measured between atom centres raises it by at most
    a layer's spacing over ``2 * radius``), so a large estimate means wrong units or piled-up
    atoms. A height ``h`` of the cell (the distance between its lattice planes) makes the
    search visit ``2 * ceil(radius / h) + 1`` images along that axis; a nearly degenerate
    cell has tiny heights. The periodic vectors must be linearly independent.
    """
    return _crowding(len(positions), positions, cell, pbc, radius)


def _crowding(
    atoms: int, positions: np.ndarray | None, cell: np.ndarray, pbc: np.ndarray, radius: float
) -> Crowding:
    """:func:`estimate_crowding` of ``atoms`` atoms; ``positions`` are read only along
    non-periodic axes (None will do for a fully periodic system)."""
    cell = np.asarray(cell, dtype=np.float64)
    pbc = np.asarray(pbc, dtype=bool)
    normals = _complement(cell[pbc])
    basis = np.vstack([cell[pbc], normals])  # periodic vectors, then unit normals
    volume = abs(np.linalg.det(basis))  # of the periodic part: normals have unit length
    # the distance between lattice planes a is 1 / |row a of the reciprocal basis|
    reciprocal = np.linalg.norm(np.linalg.inv(basis), axis=0)
    heights = tuple(float(1.0 / reciprocal[a]) for a in range(int(pbc.sum())))
    extents = np.zeros(len(normals))
    if len(normals) and atoms:
        coords = np.asarray(positions, dtype=np.float64) @ normals.T
        extents = np.ptp(coords, axis=0)
    sphere = 4 / 3 * math.pi * radius**3
    neighbors = atoms / (volume * np.prod(np.maximum(extents, 2 * radius))) * sphere
    density = atoms / (volume * np.prod(extents + 2 * _ATOM_REACH))
    images = float(np.prod([2 * math.ceil(radius / h) + 1 for h in heights]))
    return Crowding(float(neighbors), float(density), heights, images)


def _refuse_crowded(
    positions: torch.Tensor,
    host_cells: np.ndarray,
    host_pbcs: np.ndarray,
    system_index: torch.Tensor,
    radius: float,
    max_neighbors: int,
) -> None:
    """Raise :class:`NeighborOverflowError` before searching if a system is denser than
    :data:`MAX_DENSITY`, makes the search visit more than :data:`MAX_IMAGES` images of
    each atom, or is estimated to have far more than ``max_neighbors`` neighbours per atom.
    Positions are copied to the host only for a system with a non-periodic axis, the
    system index only for a batch: cheap next to the search. ``host_cells`` (float64) and
    ``host_pbcs`` are the systems' cells and pbc on the host."""
    index = None if len(host_cells) == 1 else system_index.cpu().numpy()
    counts = [len(positions)] if index is None else np.bincount(index, minlength=len(host_cells))
    host_positions = None if host_pbcs.all() else positions.detach().cpu().double().numpy()
    periodic = host_pbcs.all(axis=1)
    # fully periodic systems at once; each suspect and each other system alone below
    suspects = ~periodic
    suspects[periodic] = ~_periodic_within_limits(
        np.asarray(counts)[periodic], host_cells[periodic], radius, max_neighbors
    )
    for s in np.flatnonzero(suspects):
        cell, pbc = host_cells[s], host_pbcs[s]
        coords = host_positions
        if coords is not None and index is not None:
            coords = coords[index == s]
        crowding = _crowding(int(counts[s]), coords, cell, pbc, radius)
        if crowding.images > MAX_IMAGES:
            heights = ", ".join(f"{h:.3g}" for h in crowding.heights)
            cause = (
                f"the cell is nearly degenerate: its heights are {heights} Å, so the search "
                f"would visit about {crowding.images:.2g} periodic images of each atom (the "
                f"limit is {MAX_IMAGES:,}); check the cell vectors"
            )
        elif crowding.density > MAX_DENSITY:
            cause = (
                f"no matter is denser than about {MAX_DENSITY:g} atoms/Å³: are the positions "
                "and the cell in Å, and are the atoms not piled up?"
            )
        elif crowding.neighbors > _ESTIMATE_MARGIN * max_neighbors:
            cause = f"over {_ESTIMATE_MARGIN:g} times the limit: are the positions in Å?"
        else:
            continue
        which = f" in system {s}" if len(host_cells) > 1 else ""
        raise NeighborOverflowError(
            f"refused before the neighbour search{which}: about {crowding.neighbors:,.0f} "
            f"neighbours within {radius:g} Å expected per atom (a mean density of "
            f"{crowding.density:.3g} atoms/Å³), against a limit of {max_neighbors} "
            f"(max_neighbors); {cause}"
        )


def _periodic_within_limits(
    counts: np.ndarray, cells: np.ndarray, radius: float, max_neighbors: int
) -> np.ndarray:
    """Which fully periodic systems of ``counts`` atoms in ``cells`` (B, 3, 3) pass
    :func:`_refuse_crowded`'s tests, by :func:`_crowding`'s estimates computed for all at
    once (False for degenerate cells, which the test of each alone then explains)."""
    if not len(cells) or _maybe_degenerate(cells).any():
        return np.zeros(len(cells), dtype=bool)
    volume = np.abs(np.linalg.det(cells))
    heights = 1.0 / np.linalg.norm(np.linalg.inv(cells), axis=1)  # (B, 3), as _crowding's
    images = np.prod(2 * np.ceil(radius / heights) + 1, axis=1)
    density = counts / volume
    neighbors = density * 4 / 3 * math.pi * radius**3
    return (
        (images <= MAX_IMAGES)
        & (density <= MAX_DENSITY)
        & (neighbors <= _ESTIMATE_MARGIN * max_neighbors)
    )


class HostGeometry(NamedTuple):
    """Host (numpy) copies of positions, cell and pbc, for a staleness check that does
    not wait for the device."""

    positions: np.ndarray
    cell: np.ndarray
    pbc: np.ndarray

    def copy(self) -> HostGeometry:
        """Copies of the arrays, so later in-place edits of the atoms do not reach them."""
        return HostGeometry(*(np.array(a, copy=True) for a in self))

    def moved_from(self, searched: HostGeometry, skin: float) -> bool:
        """Whether the cell, pbc or atom count differ from ``searched``, or an atom has
        moved more than ``skin / 2`` since."""
        if self.positions.shape != searched.positions.shape:
            return True
        if not (np.array_equal(self.cell, searched.cell) and np.array_equal(self.pbc, searched.pbc)):
            return True
        if len(self.positions) == 0:
            return False
        displacement = self.positions - searched.positions
        return bool(np.einsum("ij,ij->i", displacement, displacement).max() > (skin / 2) ** 2)


class VerletNeighborList:
    """A neighbor list that searches with ``cutoff + skin`` and reuses that search.

    The search is redone only when the cell, ``pbc`` or the atoms changed, or an
    atom has moved more than ``skin / 2`` since the last search; otherwise the
    stored candidates are filtered to ``cutoff`` with the current positions. The
    returned edges are exactly those :func:`neighbor_list` would return for
    ``cutoff`` (possibly in another order); with ``drop_zero_length``, less the pairs of
    zero length (coincident atoms), as fairchem's graphs leave them out. The candidates
    keep them.
    """

    def __init__(
        self,
        cutoff: float,
        skin: float = 0.5,
        max_neighbors: int | None = None,
        *,
        drop_zero_length: bool = False,
    ) -> None:
        if cutoff <= 0 or skin < 0:
            raise ValueError(f"need cutoff > 0 and skin >= 0, got {cutoff=} and {skin=}")
        if max_neighbors is not None:
            check_positive_int(max_neighbors, "max_neighbors")
        self.cutoff = float(cutoff)
        self.skin = float(skin)
        self.max_neighbors = max_neighbors
        self.drop_zero_length = drop_zero_length
        self.searches = 0
        #: The most candidates any one atom has in the stored search (an upper bound on
        #: its pairs within the cutoff until the next search).
        self.most_candidates = 0
        self._width = _INITIAL_WIDTH
        # (positions, cell, pbc, system_index) of the stored search
        self._searched: tuple[torch.Tensor, ...] | None = None
        self._host_searched: HostGeometry | None = None
        self._candidates: tuple[torch.Tensor, torch.Tensor] | None = None
        # the candidates' cell offsets (shifts @ cell): fixed until the next search, since
        # a new cell searches again
        self._offsets: torch.Tensor | None = None

    def __call__(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        pbc: torch.Tensor,
        system_index: torch.Tensor | None = None,
        host: HostGeometry | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(edge_index, unit_shifts)`` of the pairs closer than ``cutoff`` (and longer
        than zero with ``drop_zero_length``); ``host`` as for :meth:`candidates`."""
        edge_index, shifts = self.candidates(positions, cell, pbc, system_index, host)
        if self.skin == 0 and not self.drop_zero_length:
            return edge_index, shifts
        if self._offsets is None:
            self._offsets = _offsets(cell.detach(), system_index, edge_index, shifts)
        return _within(positions.detach(), edge_index, shifts, self._offsets, self.cutoff,
                       self.drop_zero_length)

    def candidates(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        pbc: torch.Tensor,
        system_index: torch.Tensor | None = None,
        host: HostGeometry | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(edge_index, unit_shifts)`` of the stored search: every pair closer than
        ``cutoff`` and some up to ``cutoff + skin``. Searches again first if stale; the
        same tensors come back until the next search (``searches`` counts them).

        ``host``, the same positions, cell and pbc as numpy arrays, lets staleness be
        decided on the host; otherwise it is decided on the tensors' device, which
        costs one host synchronisation.
        """
        positions = positions.detach()
        cell = cell.detach()
        if self._needs_search(positions, cell, pbc, system_index, host):
            edge_index, shifts, self._width, self.most_candidates = _search(
                positions,
                cell,
                pbc,
                self.cutoff + self.skin,
                system_index,
                self._width,
                self.max_neighbors,
            )
            self.searches += 1
            self._candidates = (edge_index, shifts)
            self._offsets = None
            index = None if system_index is None else system_index.clone()
            self._searched = (positions.clone(), cell.clone(), pbc.clone(), index)
            self._host_searched = None if host is None else host.copy()
        return self._candidates

    def _needs_search(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        pbc: torch.Tensor,
        system_index: torch.Tensor | None,
        host: HostGeometry | None,
    ) -> bool:
        """Whether the stored search is stale: compared on the host if both this call and
        the search gave ``host``, else on the device (one host synchronisation)."""
        if self._searched is None:
            return True
        reference, old_cell, old_pbc, old_index = self._searched
        same_kind = (
            (positions.shape, positions.device, positions.dtype)
            == (reference.shape, reference.device, reference.dtype)
            and cell.shape == old_cell.shape
            and pbc.shape == old_pbc.shape
            and (system_index is None) == (old_index is None)
        )
        if not same_kind:
            return True
        if host is not None and self._host_searched is not None and system_index is None:
            return host.moved_from(self._host_searched, self.skin)
        stale = (cell != old_cell).any() | (pbc != old_pbc).any()
        if system_index is not None:
            stale = stale | (system_index.to(old_index.device) != old_index).any()
        if len(positions):
            stale = stale | ((positions - reference).norm(dim=1).max() > self.skin / 2)
        return bool(stale)


def _offsets(
    cell: torch.Tensor,
    system_index: torch.Tensor | None,
    edge_index: torch.Tensor,
    shifts: torch.Tensor,
) -> torch.Tensor:
    """Each edge's cell offset ``shifts @ cell`` (per system's cell for a batch)."""
    if cell.ndim == 3:
        return torch.einsum("ea,eab->eb", shifts.to(cell.dtype), cell[system_index[edge_index[0]]])
    return shifts.to(cell.dtype) @ cell


def _within(
    positions: torch.Tensor,
    edge_index: torch.Tensor,
    shifts: torch.Tensor,
    offsets: torch.Tensor,
    cutoff: float,
    drop_zero_length: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidate edges that are shorter than ``cutoff`` now (and, with
    ``drop_zero_length``, longer than zero), in few device operations: this runs at
    every call."""
    ends = positions.index_select(0, edge_index.reshape(-1)).view(2, -1, 3)
    lengths = torch.linalg.vector_norm(ends[1] - ends[0] + offsets, dim=1)
    within = lengths < cutoff
    if drop_zero_length:
        within &= lengths > 0
    keep = torch.nonzero(within).squeeze(1)  # one host synchronisation
    return edge_index.index_select(1, keep), shifts.index_select(0, keep)
