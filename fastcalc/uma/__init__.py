"""Pure-torch UMA (fairchem eSCN-MD + mixture of linear experts) inference.

Loads fairchem UMA inference checkpoints without fairchem and evaluates them
with our own implementation, equal to fairchem's ``FAIRChemCalculator`` to
round-off in float64, compiled once for every system size::

    from fastcalc.uma import BucketedCalculator
    atoms.calc = BucketedCalculator("uma-s-1p2.pt", task_name="omat")

or, with topology computed by the caller (see :mod:`fastcalc.uma.core`)::

    core = UMACore(load_checkpoint("uma-s-1p2.pt"), task="omol")
    out = core.compute(positions, cell, numbers, edge_index, unit_shifts, charge=0, spin=1)
"""

from .calculator import BucketedCalculator
from .checkpoint import (
    NotUMACheckpointError,
    UMACheckpoint,
    UnknownTaskError,
    load_checkpoint,
)
from .core import UMACore

__all__ = [
    "BucketedCalculator",
    "NotUMACheckpointError",
    "UMACheckpoint",
    "UMACore",
    "UnknownTaskError",
    "load_checkpoint",
]
