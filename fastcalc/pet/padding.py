"""Bucketed sizes of a PET layout, so compiled code and CUDA graphs see few shapes.

Three sizes are bucketed: atoms, neighbour slots per atom (the layout width) and
candidate pairs per atom (the columns of :class:`fastcalc.pet.layout.Candidates`). Each
is rounded up to a multiple of a granule that grows with the size (at most 1/8 of it),
so padding costs at most ~12% extra work and every doubling of a size has 8 buckets.
What padding adds contributes exactly nothing:

- padded atoms have no neighbours (all slots masked, pointing to themselves), no atom
  has them as a neighbour, and the energy sum leaves them out (``atom_mask``);
- padded slots are masked, as in any layout;
- padded candidate pairs are self-pairs longer than the cutoff: never kept, and where
  PET's adaptive-cutoff count and its derivatives vanish exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

#: Smallest granule of each padded size; atoms and pool stay above PyTorch's 0/1 sizes.
ATOM_STEP = 8
WIDTH_STEP = 2
POOL_STEP = 8


class PaddedShape(NamedTuple):
    """Padded sizes: atoms, neighbour slots per atom, candidate pairs per atom."""

    atoms: int
    width: int
    pool: int


def padded_size(count: int, step: int) -> int:
    """``count`` rounded up to a multiple of ``max(step, 2 ** (bit_length(count) - 4))``.

    The granule is at most 1/8 of ``count``; zero becomes ``step``.
    """
    granule = max(step, 1 << max(count.bit_length() - 4, 0))
    return max(granule, -(-count // granule) * granule)


def padded_shape(atoms: int, width: int, pool: int) -> PaddedShape:
    """The bucket of a layout with ``atoms`` atoms, ``width`` slots and ``pool`` candidate
    pairs per atom."""
    return PaddedShape(
        padded_size(atoms, ATOM_STEP), padded_size(width, WIDTH_STEP), padded_size(pool, POOL_STEP)
    )


def pad_positions(positions: torch.Tensor, atoms: int) -> torch.Tensor:
    """Positions with padded atoms at the origin."""
    return torch.cat([positions, positions.new_zeros(atoms - len(positions), 3)])


def atom_mask(num_atoms: int, atoms: int, device: torch.device) -> torch.Tensor:
    """True for the ``num_atoms`` real atoms of ``atoms`` padded ones."""
    return torch.arange(atoms, device=device) < num_atoms
