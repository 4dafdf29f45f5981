"""``BucketedCalculator``: UMA checkpoints on fastcalc's calculator machinery.

Per call: fairchem's ``max_neighbors`` rule and the expert merge (composition,
charge, spin, task) run outside any compiled code; the kept edges are padded to
a multiple of ``bucket_size``, and energy, forces and stress come from one
traced graph per (atom count, edge bucket), compiled with static shapes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from ..buckets import pad_edges
from ..calculator import InvalidAtomsError, TorchCalculator, to_host
from ..geometry import edge_vectors
from ..registry import resolve_model_path
from .checkpoint import UMACheckpoint, load_checkpoint
from .compiled import ShapeCompiledGraphs
from .core import UMACore
from .graph import apply_neighbor_limit

__all__ = ["BucketedCalculator", "charge_and_spin"]

COMPILE_MODES = (None, "default", "reduce-overhead")
CHARGE_RANGE = (-100, 100)  # fairchem's accepted ranges and defaults
SPIN_RANGE = (0, 100)
_warned_cpu_cuda_graphs = False


def charge_and_spin(info: dict, task_name: str) -> tuple[int, int]:
    """Total charge and spin multiplicity from ``atoms.info``, with fairchem's defaults
    (charge 0; spin 1 for ``omol``, else 0) and checks (integers, charge in
    [-100, 100], spin in [0, 100]); :class:`InvalidAtomsError` otherwise."""
    default_spin = 1 if task_name == "omol" else 0
    values = {"charge": info.get("charge", 0), "spin": info.get("spin", default_spin)}
    for (key, value), (low, high) in zip(values.items(), (CHARGE_RANGE, SPIN_RANGE)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise InvalidAtomsError(
                f"atoms.info[{key!r}] must be an integer, got {value!r} ({type(value).__name__})"
            )
        if not low <= value <= high:
            raise InvalidAtomsError(
                f"atoms.info[{key!r}] = {value} is outside the range {low} to {high}"
                + (" (spin is the multiplicity 2S + 1; 0 means unset)" if key == "spin" else "")
            )
    return int(values["charge"]), int(values["spin"])


def _resolve_task(core_or_checkpoint: UMACore | UMACheckpoint, task_name: str | None) -> str:
    """``task_name``, or the only task; a clear error when there is a choice to make."""
    checkpoint = core_or_checkpoint
    if isinstance(checkpoint, UMACore):
        if task_name is None:
            return checkpoint.task.name
        checkpoint = checkpoint._checkpoint
    tasks = sorted(checkpoint.tasks)
    if task_name is None:
        if len(tasks) > 1:
            raise ValueError(f"this checkpoint has several tasks: pass task_name, one of {tasks}")
        return tasks[0]
    checkpoint.task(task_name)  # UnknownTaskError listing the valid names
    return task_name


def _shape(inputs) -> tuple[int, int]:
    """Compile key: (atoms, padded edges)."""
    return inputs[0].shape[0], inputs[3].shape[1]


class BucketedCalculator(TorchCalculator):
    """Energy, forces and stress of a UMA checkpoint for one task, without fairchem.

    ``checkpoint`` is a fairchem UMA inference checkpoint (path, bundled model
    name such as ``"uma-demo-cu"``, or loaded :class:`UMACheckpoint`) or a built :class:`UMACore` (moved to ``device`` and
    ``dtype`` in place; its task is the default ``task_name``). ``task_name`` is
    the dataset head, required when there are several. ``atoms.info["charge"]``
    and ``atoms.info["spin"]`` (multiplicity) select charge and spin.

    ``compile_mode``: ``None`` runs the model eagerly; ``"default"`` compiles
    one graph per (atom count, edge bucket) with ``torch.compile``;
    ``"reduce-overhead"`` also records a CUDA graph per bucket (on CPU it warns
    once and uses ``"default"``). Other keyword arguments go to
    :class:`fastcalc.calculator.TorchCalculator` (``skin``, ...).
    """

    def __init__(
        self,
        checkpoint: str | Path | UMACheckpoint | UMACore,
        *,
        task_name: str | None = None,
        device: str | torch.device | None = None,
        dtype: str = "float32",
        bucket_size: int = 1024,
        compile_mode: str | None = "reduce-overhead",
        **kwargs,
    ) -> None:
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {compile_mode!r}")
        if isinstance(checkpoint, (str, Path)):
            checkpoint = load_checkpoint(resolve_model_path(checkpoint))
        task_name = _resolve_task(checkpoint, task_name)
        core = checkpoint if isinstance(checkpoint, UMACore) else UMACore(checkpoint, task_name)
        supported = range(1, core.element_embedding.shape[0])
        super().__init__(
            core.cutoff, supported_numbers=supported, device=device, dtype=dtype, **kwargs
        )
        self.core = core.to(device=self.device, dtype=self.dtype).requires_grad_(False)
        self.core.set_task(task_name)
        self.bucket_size = bucket_size
        self.compile_mode = self._effective_mode(compile_mode)
        self._graphs = (
            None
            if self.compile_mode is None
            else ShapeCompiledGraphs(self.core.energy_and_gradients, _shape, self.compile_mode)
        )

    def _effective_mode(self, mode: str | None) -> str | None:
        global _warned_cpu_cuda_graphs
        if mode == "reduce-overhead" and self.device.type != "cuda":
            if not _warned_cpu_cuda_graphs:
                warnings.warn(
                    f"compile_mode='reduce-overhead' needs CUDA; using 'default' on {self.device}",
                    stacklevel=3,
                )
                _warned_cpu_cuda_graphs = True
            return "default"
        return mode

    @property
    def task_name(self) -> str:
        return self.core.task.name

    def set_task(self, task_name: str) -> None:
        """Switch the dataset head (re-merged in place, compiled graphs stay valid)."""
        self.core.set_task(task_name)
        self.reset()

    @property
    def compile_stats(self) -> dict[str, int]:
        """``{"graphs": compiled shapes, "recompiles": recompilations of a known shape}``."""
        return {"graphs": 0, "recompiles": 0} if self._graphs is None else self._graphs.stats

    def evaluate(self, positions, cell, numbers, edge_index, unit_shifts, compute_stress):
        charge, spin = charge_and_spin(self.atoms.info, self.task_name)
        self.core.prepare(torch.from_numpy(self.atoms.numbers), charge, spin)  # host: no sync
        limit = self.core.max_neighbors
        if 0 < limit < self.neighbors.most_candidates:  # else no atom can exceed it: skip
            with torch.no_grad():
                lengths = edge_vectors(positions, cell, edge_index, unit_shifts).square().sum(-1)
                edge_index, unit_shifts = apply_neighbor_limit(
                    edge_index, unit_shifts, lengths, len(numbers), limit
                )
        edges = pad_edges(edge_index, unit_shifts, cell, self.cutoff, self.bucket_size)
        inputs = (positions, cell, numbers, edges.edge_index, edges.unit_shifts, edges.edge_mask)
        run = self.core.energy_and_gradients if self._graphs is None else self._graphs
        # one wait for the device; normalisers and element references apply on the host
        energy, forces, stress = map(torch.from_numpy, to_host(*run(*inputs)))
        out = self.core.outputs(energy, forces, stress, compute_stress)
        stress = out.get("stress")
        return float(out["energy"]), out["forces"].numpy(), None if stress is None else stress.numpy()
