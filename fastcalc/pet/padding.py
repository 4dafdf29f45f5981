"""Pad a PET layout to bucketed sizes so compiled code and CUDA graphs see few shapes.

Three sizes are bucketed: atoms, neighbour slots per atom (the layout width) and, for
adaptive-cutoff models, the pair pool. Each is rounded up to a multiple of a granule
that grows with the size (at most 1/8 of it), so padding costs at most ~12% extra
work and every doubling of a size has 8 buckets. What padding adds contributes
exactly nothing:

- padded atoms have no neighbours (all slots masked, pointing to themselves), no atom
  has them as a neighbour, and the energy sum leaves them out (``atom_mask``);
- padded slots are masked, as in any layout;
- padded pool pairs are self-pairs of atom 0 longer than the cutoff, where PET's
  adaptive-cutoff count and its derivatives vanish exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..buckets import pad_edges
from .layout import PETLayout

#: Smallest granule of each padded size; atoms and pool stay above PyTorch's 0/1 sizes.
ATOM_STEP = 8
WIDTH_STEP = 4
POOL_STEP = 64


class PaddedShape(NamedTuple):
    """Padded sizes: atoms, neighbour slots per atom, adaptive-cutoff pool pairs."""

    atoms: int
    width: int
    pool: int


def padded_size(count: int, step: int) -> int:
    """``count`` rounded up to a multiple of ``max(step, 2 ** (bit_length(count) - 4))``.

    The granule is at most 1/8 of ``count``; zero becomes ``step``.
    """
    granule = max(step, 1 << max(count.bit_length() - 4, 0))
    return max(granule, -(-count // granule) * granule)


def padded_shape(layout: PETLayout, adaptive: bool) -> PaddedShape:
    """The bucket of a layout; the pool is padded for adaptive-cutoff models only."""
    atoms, width = layout.neighbors.shape
    pool = padded_size(len(layout.pool_centers), POOL_STEP) if adaptive else 0
    return PaddedShape(padded_size(atoms, ATOM_STEP), padded_size(width, WIDTH_STEP), pool)


@torch.no_grad()
def pad_layout(
    layout: PETLayout, shape: PaddedShape, cell: torch.Tensor, cutoff: float
) -> PETLayout:
    """``layout`` grown to ``shape`` (see the module docstring for what is added).

    ``cell`` must have no zero vector (see :func:`fastcalc.buckets.padding_cell`);
    padded pool pairs lie beyond ``cutoff`` along its longest vector.
    """
    n, k = layout.neighbors.shape
    atoms, width = shape.atoms, shape.width
    if atoms < n or width < k or shape.pool < len(layout.pool_centers):
        raise ValueError(f"cannot pad a layout of {n} atoms x {k} slots to {tuple(shape)}")
    device = layout.neighbors.device
    species = layout.species.new_zeros(atoms)
    species[:n] = layout.species
    neighbors = torch.arange(atoms, device=device)[:, None].repeat(1, width)
    neighbors[:n, :k] = layout.neighbors
    shifts = layout.shifts.new_zeros(atoms, width, 3)
    shifts[:n, :k] = layout.shifts
    mask = layout.mask.new_zeros(atoms, width)
    mask[:n, :k] = layout.mask
    reverse = torch.arange(atoms * width, device=device).view(atoms, width)
    if k > 0:  # slot (j, s) of the old grid is j * k + s; it becomes j * width + s
        old = layout.reverse
        reverse[:n, :k] = torch.where(layout.mask, old // k * width + old % k, reverse[:n, :k])
    pool = layout.pool_centers, layout.pool_neighbors, layout.pool_shifts
    if shape.pool > 0:
        edges = pad_edges(
            torch.stack(pool[:2]), layout.pool_shifts, cell, cutoff, bucket_size=shape.pool
        )
        pool = edges.edge_index[0], edges.edge_index[1], edges.unit_shifts
    return PETLayout(species, neighbors, shifts, mask, reverse, *pool)


def pad_positions(positions: torch.Tensor, atoms: int) -> torch.Tensor:
    """Positions with padded atoms at the origin."""
    return torch.cat([positions, positions.new_zeros(atoms - len(positions), 3)])


def atom_mask(num_atoms: int, atoms: int, device: torch.device) -> torch.Tensor:
    """True for the ``num_atoms`` real atoms of ``atoms`` padded ones."""
    return torch.arange(atoms, device=device) < num_atoms
