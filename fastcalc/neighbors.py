"""Neighbor lists on nvalchemiops, in ASE's ``neighbor_list("ijS")`` convention.

An edge ``(i, j, S)`` stands for the vector ``positions[j] - positions[i] + S @ cell``
with ``i`` the centre atom. :func:`neighbor_list` returns exactly the multiset of
edges that ASE returns, for one system or a batch of systems, on CPU or CUDA.
:class:`VerletNeighborList` adds a Verlet skin so that the search runs only when
atoms have moved far enough to matter.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from .stderr_filter import NO_CUDA_DRIVER_NOTICE, dropping_stderr_lines

with dropping_stderr_lines(NO_CUDA_DRIVER_NOTICE):  # warp's notice on CPU-only machines
    from nvalchemiops.torch.neighbors import neighbor_list as _nvalchemi_neighbor_list

__all__ = ["HostGeometry", "NeighborOverflowError", "VerletNeighborList", "neighbor_list"]

#: Initial per-atom width of the neighbor matrix; widened on demand.
_INITIAL_WIDTH = 64
#: The neighbor matrix is widened in steps of this many columns.
_WIDTH_STEP = 16


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
    ``max_neighbors`` neighbours.
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
    cells = cell if batched else cell.unsqueeze(0)
    pbcs = (pbc if batched else pbc.unsqueeze(0)).to(device=device, dtype=torch.bool)
    if system_index is None:
        system_index = torch.zeros(n_atoms, dtype=torch.long, device=device)
    search_cells = _search_cells(positions, cells, pbcs, system_index, cutoff)
    kwargs: dict = {"method": "cell_list"}
    if batched:
        counts = torch.bincount(system_index, minlength=cells.shape[0])
        ptr = torch.zeros(cells.shape[0] + 1, dtype=torch.int32, device=device)
        ptr[1:] = torch.cumsum(counts, 0)
        kwargs.update(
            cell=search_cells, pbc=pbcs, batch_idx=system_index.to(torch.int32), batch_ptr=ptr
        )
    else:
        kwargs.update(cell=search_cells[0], pbc=pbcs[0])
    while True:
        matrix, counts, shifts = _nvalchemi_neighbor_list(
            positions, cutoff, max_neighbors=width, **kwargs
        )
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


def _search_cells(
    positions: torch.Tensor,
    cells: torch.Tensor,
    pbcs: torch.Tensor,
    system_index: torch.Tensor,
    cutoff: float,
) -> torch.Tensor:
    """Cells nvalchemiops can search: non-periodic vectors replaced by long normals.

    Shifts along a non-periodic axis are always zero, so that axis's cell vector
    never enters an edge vector; it only needs to be non-degenerate and long
    enough that the search bins stay sensible. It is replaced by a unit vector
    normal to the periodic vectors, as long as the system's extent plus the cutoff.
    """
    out = cells.detach().clone()
    for s, (cell, pbc) in enumerate(zip(cells.detach().cpu().double(), pbcs.cpu())):
        periodic = [cell[a] for a in range(3) if pbc[a]]
        normals = _complement(periodic)
        if not normals:
            continue
        coords = positions.detach()[system_index == s].cpu().double()
        for axis, normal in zip((a for a in range(3) if not pbc[a]), normals):
            projected = coords @ normal
            extent = float(projected.max() - projected.min()) if len(coords) else 0.0
            out[s, axis] = normal * (extent + cutoff + 1.0)
    return out


def _complement(periodic: list[torch.Tensor]) -> list[torch.Tensor]:
    """Orthonormal vectors normal to the span of the ``periodic`` cell vectors."""
    basis: list[torch.Tensor] = []
    for v in [*periodic, *torch.eye(3, dtype=torch.float64)]:
        w = v - sum(((v @ u) * u for u in basis), torch.zeros(3, dtype=torch.float64))
        independent = bool(w.norm() > 1e-8 * max(float(v.norm()), 1e-300))
        if len(basis) < len(periodic) and not independent:
            raise ValueError(
                "the cell vectors of the periodic axes are zero or linearly dependent: "
                f"{[v.tolist() for v in periodic]}"
            )
        if independent and len(basis) < 3:
            basis.append(w / w.norm())
    return basis[len(periodic):]


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
    ``cutoff`` (possibly in another order).
    """

    def __init__(
        self, cutoff: float, skin: float = 0.5, max_neighbors: int | None = None
    ) -> None:
        if cutoff <= 0 or skin < 0:
            raise ValueError(f"need cutoff > 0 and skin >= 0, got {cutoff=} and {skin=}")
        self.cutoff = float(cutoff)
        self.skin = float(skin)
        self.max_neighbors = max_neighbors
        self.searches = 0
        #: The most candidates any one atom has in the stored search (an upper bound on
        #: its pairs within the cutoff until the next search).
        self.most_candidates = 0
        self._width = _INITIAL_WIDTH
        # (positions, cell, pbc, system_index) of the stored search
        self._searched: tuple[torch.Tensor, ...] | None = None
        self._host_searched: HostGeometry | None = None
        self._candidates: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        pbc: torch.Tensor,
        system_index: torch.Tensor | None = None,
        host: HostGeometry | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(edge_index, unit_shifts)`` of the pairs closer than ``cutoff``; ``host``
        as for :meth:`candidates`."""
        edge_index, shifts = self.candidates(positions, cell, pbc, system_index, host)
        if self.skin == 0:
            return edge_index, shifts
        return _within(positions, cell, system_index, edge_index, shifts, self.cutoff)

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


def _within(
    positions: torch.Tensor,
    cell: torch.Tensor,
    system_index: torch.Tensor | None,
    edge_index: torch.Tensor,
    shifts: torch.Tensor,
    cutoff: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidate edges that are shorter than ``cutoff`` now."""
    i, j = edge_index
    if cell.ndim == 3:
        offsets = torch.einsum("ea,eab->eb", shifts.to(cell.dtype), cell[system_index[i]])
    else:
        offsets = shifts.to(cell.dtype) @ cell
    lengths = (positions[j] - positions[i] + offsets).norm(dim=1)
    keep = torch.nonzero(lengths < cutoff).squeeze(1)  # one host synchronisation
    return edge_index.index_select(1, keep), shifts.index_select(0, keep)
