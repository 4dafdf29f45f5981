"""Bucketed sizes of a PET layout, so compiled code and CUDA graphs see few shapes.

Three sizes are bucketed: atoms, neighbour slots per atom (the layout width) and
candidate pairs per atom (the columns of :class:`fastcalc.pet.layout.Candidates`). Each
is rounded up by :func:`fastcalc.buckets.padded_size` with ``fraction`` 8, so padding
costs at most ~12% extra work and every doubling of a size has 8 buckets.
What padding adds contributes exactly nothing:

- padded atoms have no neighbours (all slots masked, pointing to themselves), no atom
  has them as a neighbour, and the energy sum leaves them out (``atom_mask``);
- padded slots are masked, as in any layout;
- padded candidate pairs are self-pairs longer than the cutoff: never kept, and where
  PET's adaptive-cutoff count and its derivatives vanish exactly.
"""

from __future__ import annotations

from typing import NamedTuple

from ..buckets import padded_size

#: Smallest granule of each padded size; atoms and pool stay above PyTorch's 0/1 sizes.
ATOM_STEP = 8
WIDTH_STEP = 2
POOL_STEP = 8


class PaddedShape(NamedTuple):
    """Padded sizes: atoms, neighbour slots per atom, candidate pairs per atom."""

    atoms: int
    width: int
    pool: int


def padded_shape(atoms: int, width: int, pool: int) -> PaddedShape:
    """The bucket of a layout with ``atoms`` atoms, ``width`` slots and ``pool`` candidate
    pairs per atom."""
    return PaddedShape(
        padded_size(atoms, ATOM_STEP), padded_size(width, WIDTH_STEP), padded_size(pool, POOL_STEP)
    )
