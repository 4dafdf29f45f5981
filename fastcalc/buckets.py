"""Edge buckets: pad an edge list to one of few sizes so compiled code sees few shapes.

Padding policy. The edge count is rounded up to a multiple of ``bucket_size``;
the same count always gives the same bucket, so returning to a size seen before
reuses its shape (and its compiled graph). Each padded edge is a self-loop of
the first atom of system 0 with a cell shift that makes it longer than the
cutoff, so a model whose cutoff function vanishes there gives it exactly zero
energy, force and stress, and no zero-length vector (whose gradient would be
NaN) ever appears. Models also get ``edge_mask`` to drop padded edges outright.
Atom counts are not padded here: a model that needs padded atoms (PET's
per-atom neighbour layout) pads its own layout.

Padded edges need a cell with a non-zero vector; for a non-periodic system
:func:`padding_cell` gives the cell to hand to the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["PaddedEdges", "bucket", "pad_edges", "padding_cell", "padding_shift"]


@dataclass(frozen=True)
class PaddedEdges:
    """An edge list padded to a bucket; ``edge_mask`` marks the real edges."""

    edge_index: torch.Tensor  # (2, E_pad) int64
    unit_shifts: torch.Tensor  # (E_pad, 3) int64
    edge_mask: torch.Tensor  # (E_pad,) bool

    @property
    def n_real(self) -> int:
        return int(self.edge_mask.sum())


def bucket(count: int, bucket_size: int) -> int:
    """``count`` rounded up to a positive multiple of ``bucket_size``."""
    if bucket_size < 1:
        raise ValueError(f"bucket_size must be positive, got {bucket_size}")
    return bucket_size * max(1, math.ceil(count / bucket_size))


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
    :func:`padding_cell`), long enough that a self-loop with it lies beyond ``cutoff``.

    Computed on the device, so padding never waits for the device.
    """
    lengths = cell.detach().norm(dim=1)
    if cell.device.type == "cpu" and float(lengths.max()) <= 0:  # free on the CPU only
        raise ValueError("cannot pad edges with a zero cell: use padding_cell(cell, cutoff)")
    axis = torch.argmax(lengths)
    repeats = torch.floor(cutoff / lengths[axis]).long() + 1
    return (torch.arange(3, device=cell.device) == axis).long() * repeats


def pad_edges(
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    cell: torch.Tensor,
    cutoff: float,
    bucket_size: int = 1024,
) -> PaddedEdges:
    """Pad ``(edge_index, unit_shifts)`` to ``bucket(E, bucket_size)`` edges.

    ``cell`` is the cell the model will see (``(3, 3)``, or ``(B, 3, 3)`` for a
    batch, where padded edges use system 0); it must have no zero vector (see
    :func:`padding_cell`). The padded edges' shift is along the longest vector of
    that cell, long enough to lie beyond ``cutoff``.
    """
    n_edges = edge_index.shape[1]
    n_pad = bucket(n_edges, bucket_size) - n_edges
    device = edge_index.device
    shift = padding_shift(cell[0] if cell.ndim == 3 else cell, cutoff)
    return PaddedEdges(
        edge_index=torch.cat([edge_index, edge_index.new_zeros((2, n_pad))], dim=1),
        unit_shifts=torch.cat([unit_shifts, shift.expand(n_pad, 3)], dim=0),
        edge_mask=torch.cat(
            [
                torch.ones(n_edges, dtype=torch.bool, device=device),
                torch.zeros(n_pad, dtype=torch.bool, device=device),
            ]
        ),
    )
