"""ASE calculator for UMA checkpoints on fastcalc's calculator machinery."""

from __future__ import annotations

from pathlib import Path

import torch

from ..calculator import TorchCalculator
from ..geometry import edge_vectors
from .checkpoint import UMACheckpoint, load_checkpoint
from .core import UMACore
from .graph import limit_neighbors


def system_charge_spin(info: dict, task: str) -> tuple[int, int]:
    """fairchem's defaults: charge 0; spin multiplicity 1 for ``omol``, else 0."""
    return int(info.get("charge", 0)), int(info.get("spin", 1 if task == "omol" else 0))


class UMACalculator(TorchCalculator):
    """Energy, forces and stress of a UMA checkpoint for one task, without fairchem.

    ``atoms.info["charge"]`` and ``atoms.info["spin"]`` (multiplicity) select the
    charge and spin; changing them, or the composition, re-merges the experts.
    Keyword arguments go to :class:`fastcalc.calculator.TorchCalculator`
    (``device``, ``dtype`` ("float32" or "float64"), ``skin``, ...).
    """

    def __init__(self, checkpoint: str | Path | UMACheckpoint, task: str, **kwargs) -> None:
        if not isinstance(checkpoint, UMACheckpoint):
            checkpoint = load_checkpoint(checkpoint)
        checkpoint.task(task)  # fail early on an unknown task
        core = UMACore(checkpoint, task)
        super().__init__(core.cutoff, **kwargs)
        self.core = core.to(device=self.device, dtype=self.dtype)
        self.task = task

    def set_task(self, task: str) -> None:
        """Switch task (dataset head, embedding, normalisers); clears cached results."""
        self.core.set_task(task)
        self.task = task
        self.reset()

    def evaluate(self, positions, cell, numbers, edge_index, unit_shifts, compute_stress):
        with torch.no_grad():
            lengths = edge_vectors(positions, cell, edge_index, unit_shifts).square().sum(-1)
            keep = limit_neighbors(edge_index, lengths, len(numbers), self.core.max_neighbors)
        charge, spin = system_charge_spin(self.atoms.info, self.task)
        out = self.core.compute(
            positions, cell, numbers, edge_index, unit_shifts,
            edge_mask=keep, charge=charge, spin=spin, stress=compute_stress,
        )
        return out["energy"], out["forces"], out.get("stress")
