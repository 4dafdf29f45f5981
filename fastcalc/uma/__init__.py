"""Pure-torch UMA (fairchem eSCN-MD + mixture of linear experts) inference.

Loads fairchem UMA inference checkpoints without fairchem and evaluates them
with our own implementation, equal to fairchem's ``FAIRChemCalculator`` to
round-off::

    from fastcalc.uma.calculator import UMACalculator
    atoms.calc = UMACalculator("uma-s-1p2.pt", task="omat", dtype="float64")

or, with topology computed by the caller (see :mod:`fastcalc.uma.core`)::

    core = UMACore(load_checkpoint("uma-s-1p2.pt"), task="omol")
    out = core.compute(positions, cell, numbers, edge_index, unit_shifts, charge=0, spin=1)
"""

from .checkpoint import (
    NotUMACheckpointError,
    UMACheckpoint,
    UnknownTaskError,
    load_checkpoint,
)
from .core import UMACore

__all__ = [
    "NotUMACheckpointError",
    "UMACheckpoint",
    "UMACore",
    "UnknownTaskError",
    "load_checkpoint",
]
