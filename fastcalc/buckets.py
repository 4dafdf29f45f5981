"""Buckets: sizes padded to one of few values, so compiled code and CUDA graphs see few shapes.

Padding rule (:func:`padded_size`, the one rule every model uses): a count is
rounded up to a multiple of a granule that grows with it, ``max(step, 2 ** k)``
with ``2 ** k`` at most ``1 / fraction`` of the count. So padding adds at most
``step`` or ``1 / fraction`` of the count, whichever is larger, and each doubling
of a count has ``fraction`` buckets; the same count always gives the same bucket,
so returning to a size seen before reuses its shape. Edges use ``fraction`` 64
(:data:`EDGE_FRACTION`: at most 1.6 % padded edges beyond ``bucket_size``), atoms
and per-atom layouts use 8 (:data:`ATOM_FRACTION`: at most 12.5 % beyond their
step; per-atom work is cheap next to per-edge work).

Padded edges. Each padded edge is a self-loop of
the first atom of system 0 with a cell shift that makes it longer than the
cutoff, so a model whose cutoff function vanishes there gives it exactly zero
energy, force and stress, and no zero-length vector (whose gradient would be
NaN) ever appears. Models also get ``edge_mask`` to drop padded edges outright.
Padded atoms (:func:`pad_atoms`) sit at the origin with no edges; models leave
them out of the energy with an atom mask, so they get no force and add nothing.

Padded edges need a cell with a non-zero vector; for a non-periodic system
:func:`padding_cell` gives the cell to hand to the model.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

__all__ = [
    "ATOM_FRACTION",
    "BATCH_STEP",
    "EDGE_FRACTION",
    "PaddedEdges",
    "atom_mask",
    "pad_atoms",
    "pad_edges",
    "pad_systems",
    "padded_size",
    "padding_cell",
    "padding_shift",
]

#: Each doubling of an edge count has this many buckets (padding at most 1/64).
EDGE_FRACTION = 64
#: Each doubling of an atom count has this many buckets (padding at most 1/8).
ATOM_FRACTION = 8
#: Batches of systems are padded with empty systems to multiples of this (:func:`pad_systems`).
BATCH_STEP = 4


@dataclass(frozen=True)
class PaddedEdges:
    """An edge list padded to a bucket; ``edge_mask`` marks the real edges."""

    edge_index: torch.Tensor  # (2, E_pad) int64
    unit_shifts: torch.Tensor  # (E_pad, 3) int64
    edge_mask: torch.Tensor  # (E_pad,) bool

    @property
    def n_real(self) -> int:
        """How many edges are real (not padding): a host synchronisation."""
        return int(self.edge_mask.sum())


def check_positive_int(value: int, name: str) -> None:
    """Raise ``ValueError`` naming the setting ``name`` unless ``value`` is a positive
    integer (padding steps, neighbour limits, atom budgets)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def padded_size(count: int, step: int, fraction: int = ATOM_FRACTION) -> int:
    """``count`` rounded up to a multiple of ``max(step, 2 ** k)``, the largest power of
    two with ``2 ** k <= count / fraction`` (``fraction`` a power of two); zero becomes
    the granule.

    Padding adds less than ``max(step, count / fraction)``.
    """
    if step < 1:
        raise ValueError(f"the padding step must be positive, got {step}")
    granule = max(step, 1 << max(count.bit_length() - fraction.bit_length(), 0))
    return max(granule, -(-count // granule) * granule)


def pad_atoms(values: torch.Tensor, atoms: int) -> torch.Tensor:
    """Per-atom ``values`` (positions, ...) padded with zero rows to ``atoms`` rows."""
    padding = (0, 0) * (values.ndim - 1) + (0, atoms - len(values))
    return torch.nn.functional.pad(values, padding)


def atom_mask(num_atoms: int, atoms: int, device: torch.device) -> torch.Tensor:
    """True for the ``num_atoms`` real atoms of ``atoms`` padded ones."""
    return torch.arange(atoms, device=device) < num_atoms


def padding_cell(cell: torch.Tensor, cutoff: float) -> torch.Tensor:
    """``cell`` with zero vectors replaced by ones of length ``cutoff``.

    Only padded edges use those vectors: real edges have zero shift along a
    non-periodic axis, so the replacement changes no real edge vector.
    """
    lengths = cell.norm(dim=-1, keepdim=True)
    filler = torch.eye(3, dtype=cell.dtype, device=cell.device).expand_as(cell) * cutoff
    return torch.where(lengths > 0, cell, filler)


def padding_shift(cell: torch.Tensor, cutoff: float) -> torch.Tensor:
    """(3,) int64 shift along the longest vector of ``cell`` (no zero vector, see
    :func:`padding_cell`), long enough that a self-loop with it lies beyond ``cutoff``;
    (..., 3) for cells (..., 3, 3), one shift per cell.

    Computed on the device, so padding never waits for the device.
    """
    lengths = cell.detach().norm(dim=-1)
    if cell.device.type == "cpu" and float(lengths.amax(dim=-1).min()) <= 0:  # free on CPU only
        raise ValueError("cannot pad edges with a zero cell: use padding_cell(cell, cutoff)")
    axis = torch.argmax(lengths, dim=-1, keepdim=True)
    repeats = torch.floor(cutoff / lengths.gather(-1, axis)).long() + 1
    return (torch.arange(3, device=cell.device) == axis).long() * repeats


def pad_systems(cells: torch.Tensor) -> torch.Tensor:
    """Cells (B, 3, 3) of a batch followed by identity cells of empty systems, up to a
    multiple of :data:`BATCH_STEP` above B: a batch of one must not trace a graph
    specialised to one system, nor a batch of three one that guards on 3."""
    spare = padded_size(len(cells) + 1, BATCH_STEP) - len(cells)
    eye = torch.eye(3, dtype=cells.dtype, device=cells.device)
    return torch.cat([cells, eye.expand(spare, 3, 3)])


def pad_edges(
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    cell: torch.Tensor,
    cutoff: float,
    bucket_size: int = 1024,
    shift: torch.Tensor | None = None,
) -> PaddedEdges:
    """Pad ``(edge_index, unit_shifts)`` to ``padded_size(E, bucket_size, EDGE_FRACTION)``
    edges.

    ``cell`` is the cell the model will see (``(3, 3)``, or ``(B, 3, 3)`` for a
    batch, where padded edges use system 0); it must have no zero vector (see
    :func:`padding_cell`). The padded edges' shift is along the longest vector of
    that cell, long enough to lie beyond ``cutoff``; a caller that pads many edge lists
    of one cell may pass it as ``shift`` (:func:`padding_shift`). Few device operations:
    this runs at every call.
    """
    n_edges = edge_index.shape[1]
    total = padded_size(n_edges, bucket_size, EDGE_FRACTION)
    if shift is None:
        shift = padding_shift(cell[0] if cell.ndim == 3 else cell, cutoff)
    return PaddedEdges(
        edge_index=torch.nn.functional.pad(edge_index, (0, total - n_edges)),
        unit_shifts=torch.cat([unit_shifts, shift.expand(total - n_edges, 3)], dim=0),
        edge_mask=torch.arange(total, device=edge_index.device) < n_edges,
    )
