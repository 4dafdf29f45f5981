"""``BucketedCalculator``: UMA checkpoints on fastcalc's calculator machinery.

Per call: the expert merge (composition, charge, spin, task) runs outside any
compiled code; atoms and the Verlet list's candidate pairs are padded to buckets
(:mod:`fastcalc.buckets`), and one traced graph, compiled once with dynamic shapes
and, on CUDA, replayed from a CUDA graph recorded per padded shape
(:class:`fastcalc.tracing.GraphRunner`), picks the edges within the cutoff into an edge
bucket sized at the neighbour search (:func:`fastcalc.uma.graph.edges_within`) and
computes energy, forces and stress: between neighbour searches the host does not wait
for the device before the model runs. Where fairchem's ``max_neighbors`` rule may drop
edges, the edges are picked and limited on the host instead, every call.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from ase import Atoms

from ..buckets import (
    EDGE_FRACTION, atom_mask, check_positive_int, pad_atoms, pad_edges, pad_systems, padded_size,
)
from ..calculator import (
    InvalidAtomsError, Result, System, TorchCalculator, resolve_device, to_host,
)
from ..compile_cache import tensors_digest
from ..demo_models import FITTED_ELEMENTS
from ..geometry import edge_vectors
from ..registry import resolve_model_path
from ..tracing import resolve_compile_mode
from .checkpoint import UMACheckpoint, load_checkpoint
from .core import UMACore
from .graph import apply_neighbor_limit, kept_candidates

__all__ = ["BucketedCalculator"]

#: Padded atom counts are multiples of at least this (see :func:`fastcalc.buckets.padded_size`).
ATOM_STEP = 8
CHARGE_RANGE = (-100, 100)  # fairchem's accepted ranges and defaults
SPIN_RANGE = (0, 100)


def check_charge_and_spin(charge: int, spin: int) -> None:
    """fairchem's ranges: charge in [-100, 100], spin multiplicity in [0, 100]."""
    ranges = (CHARGE_RANGE, SPIN_RANGE)
    for key, value, (low, high) in zip(("charge", "spin"), (charge, spin), ranges):
        if not low <= value <= high:
            raise InvalidAtomsError(
                f"atoms.info[{key!r}] = {value} is outside the range {low} to {high}"
                + (" (spin is the multiplicity 2S + 1; 0 means unset)" if key == "spin" else "")
            )


def edge_slots(count: int, step: int, device: torch.device) -> torch.Tensor:
    """``arange(width)`` of the edge bucket for ``count`` edges (see :func:`padded_size`)."""
    return torch.arange(padded_size(count, step, EDGE_FRACTION), device=device)


class Candidates(NamedTuple):
    """A neighbour search's candidate pairs padded to a bucket, and the edge bucket the
    graph packs the pairs within the cutoff into (``slots``, see :func:`edge_slots`)."""

    search: int | None  # the neighbour list's search counter; None: this call's only
    edge_index: torch.Tensor  # (2, C_pad)
    unit_shifts: torch.Tensor  # (C_pad, 3)
    slots: torch.Tensor


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


class BucketedCalculator(TorchCalculator):
    """Energy, per-atom energies, forces and stress of a UMA checkpoint for one task,
    without fairchem.

    ``checkpoint`` is a fairchem UMA inference checkpoint (path, bundled model
    name such as ``"uma-demo-cu"``, or loaded :class:`UMACheckpoint`) or a built
    :class:`UMACore` (moved to ``device`` and ``dtype`` in place; its task is the
    default ``task_name``). ``task_name`` is the dataset head, required when there
    are several. ``atoms.info["charge"]`` and ``atoms.info["spin"]`` (multiplicity)
    select charge and spin.

    Padding: atoms are padded with :func:`fastcalc.buckets.padded_size` (step 8, at
    most 1/8 more atoms), edges with step ``bucket_size`` and at most 1/64 more
    edges beyond it; padded atoms and edges add exactly nothing. ``compile_mode``
    (see :func:`fastcalc.tracing.resolve_compile_mode`): ``"auto"`` (default) records
    CUDA graphs on CUDA and runs eagerly on CPU; ``"default"`` compiles once with
    dynamic shapes, so every system size shares one compilation; ``"reduce-overhead"``
    also replays a CUDA graph recorded per padded shape; ``"eager"`` compiles
    nothing. ``calc.compile_stats`` counts compilations, CUDA graphs and recompiles.
    Other keyword arguments go to :class:`fastcalc.calculator.TorchCalculator`
    (``skin``, ``max_neighbors``, ...), among them ``precision``: ``"float32"`` (default)
    is IEEE float32 throughout, even with torch's global TF32 flags on; ``"tf32"`` runs
    the SO(2) convolutions, radial networks and feed-forward layers on TF32 tensor cores
    (CUDA), while geometry, Wigner rotations, forces and stress stay IEEE float32
    (:mod:`fastcalc.precision`). Stress is defined for any cell with a
    volume, slabs included, as fairchem's.

    Per-atom energies (``atoms.get_potential_energies()``, which fairchem does not
    offer) come from the same call and sum to the energy: each atom's network output
    through the energy normaliser, an equal share of its mean and the element reference
    of its element (see :meth:`fastcalc.uma.UMACore.outputs`).

    Example::

        from ase.build import bulk
        atoms = bulk("Cu", cubic=True).repeat(3)
        atoms.calc = BucketedCalculator("uma-demo-cu")
        print(atoms.get_potential_energy(), atoms.get_forces()[0])
    """

    implemented_properties = [*TorchCalculator.implemented_properties, "energies"]
    #: fairchem's graphs leave out pairs of zero length (coincident atoms), whose direction
    #: is undefined: the model sees them not at all, and no zero-length vector reaches
    #: autograd (the gradient of its norm is NaN).
    drops_zero_length_edges = True
    evaluates_batches = True
    takes_candidates = True
    default_parameters = {
        **TorchCalculator.default_parameters,
        "task_name": None,
        "bucket_size": 256,
        "compile_mode": "auto",
    }

    def __init__(
        self,
        checkpoint: str | Path | UMACheckpoint | UMACore,
        *,
        task_name: str | None = None,
        device: str | torch.device | None = None,
        dtype: str = "float32",
        bucket_size: int = 256,
        compile_mode: str = "auto",
        **kwargs,
    ) -> None:
        if compile_mode is None:
            warnings.warn(
                "BucketedCalculator(compile_mode=None) is deprecated: use compile_mode='eager'",
                DeprecationWarning,
                stacklevel=2,
            )
            compile_mode = "eager"
        check_positive_int(bucket_size, "bucket_size")
        device = resolve_device(device)  # a missing GPU is named before the checkpoint loads
        name = str(checkpoint) if isinstance(checkpoint, (str, Path)) else type(checkpoint).__name__
        fitted = None
        if isinstance(checkpoint, (str, Path)):
            path = resolve_model_path(checkpoint)
            fitted = FITTED_ELEMENTS.get(path.resolve())  # a bundled model: what it was fitted on
            checkpoint = load_checkpoint(path)
        task_name = _resolve_task(checkpoint, task_name)
        core = checkpoint if isinstance(checkpoint, UMACore) else UMACore(checkpoint, task_name)
        supported = fitted or range(1, core.element_embedding.shape[0])
        super().__init__(
            core.cutoff, supported_numbers=supported, device=device, dtype=dtype, **kwargs
        )
        self.compile_mode = resolve_compile_mode(compile_mode, self.device)
        self.core = core.to(device=self.device, dtype=self.dtype).requires_grad_(False)
        self.core.set_task(task_name)
        self.bucket_size = bucket_size
        self._runner = self.graph_runner(self.core.energy_and_gradients_within, self.compile_mode)
        self._batch_runner = self.graph_runner(
            self.core.batch_energies_and_gradients, self.compile_mode, graph="batch"
        )
        self.parameters.update(
            checkpoint=name, task_name=task_name, bucket_size=bucket_size, compile_mode=compile_mode
        )
        # (numbers on the device, padded atoms, padded numbers, atom mask)
        self._padded: tuple[torch.Tensor, int, torch.Tensor, torch.Tensor] | None = None
        self._candidates: Candidates | None = None

    def _check_structure(self, atoms: Atoms) -> bool:
        """The base checks (returning whether the cell has a volume), then fairchem's rule
        for one atom without periodic boundaries: the model is evaluated on it only if the
        checkpoint declares ``supports_single_atoms``. Otherwise fairchem returns a
        tabulated isolated-atom energy (``atom_refs`` of its pretrained-model registry, not
        in the checkpoint) or raises; so does this calculator."""
        has_volume = super()._check_structure(atoms)
        if len(atoms) == 1 and not atoms.pbc.any() and not self.core.supports_single_atoms:
            raise InvalidAtomsError(
                f"a single {atoms.get_chemical_symbols()[0]} atom without periodic boundaries: "
                "this UMA checkpoint does not declare supports_single_atoms, so, as in "
                "fairchem, the model is not evaluated on it; fairchem's pretrained-model "
                "registry gives isolated-atom energies (atom_refs) for such atoms instead"
            )
        return has_volume

    @property
    def task_name(self) -> str:
        """The dataset head in use."""
        return self.core.task.name

    @property
    def default_spin(self) -> int:
        """fairchem's default spin multiplicity: 1 for ``omol``, else 0 (unset)."""
        return 1 if self.task_name == "omol" else 0

    def set_task(self, task_name: str) -> None:
        """Switch the dataset head (re-merged in place, compiled graphs stay valid); the
        settings that ``todict()`` and so ASE's trajectories record name the new one."""
        self.core.set_task(task_name)
        self.parameters["task_name"] = task_name
        self.reset()

    def memory_estimate(self, atoms: int, neighbors: float) -> float:
        """Bytes of one call: per edge, five node-feature-sized rows ((lmax+1)² x channels)
        per layer, a little above what the UMA-S-shaped model used when compiled on the H200
        (5.8 GiB for 1008 Cu atoms, 78 neighbours each, float32 and TF32, 2026-12-04; the
        estimate says 6.8). Edges per atom are capped at the checkpoint's ``max_neighbors``."""
        core = self.core
        per_edge = 5 * len(core.blocks) * (core.lmax + 1) ** 2 * core.channels
        edges = atoms * min(neighbors, core.max_neighbors)
        return edges * per_edge * self.dtype.itemsize

    def model_digest(self) -> str:
        """Digest of the checkpoint's weights (experts unmerged) and hyper-parameters,
        whatever composition the merged weights hold now (names its compiled code)."""
        checkpoint = self.core._checkpoint
        return tensors_digest(
            checkpoint.weights, (checkpoint.backbone, checkpoint.heads, checkpoint.model_id)
        )

    def _padded_numbers(self, numbers: torch.Tensor, atoms: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``numbers`` padded to ``atoms`` (padded atoms repeat the first element) and the
        mask of real atoms; made again only when ``numbers`` (cached on the device by the
        base class) or the padding changed."""
        cached = self._padded
        if cached is None or cached[0] is not numbers or cached[1] != atoms:
            padding = numbers[:1].expand(atoms - len(numbers))
            mask = atom_mask(len(numbers), atoms, numbers.device)
            self._padded = (numbers, atoms, torch.cat([numbers, padding]), mask)
        return self._padded[2], self._padded[3]

    def _limited_edges(self, system: System) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch's pairs under fairchem's neighbour limit, on the device; skipped when no
        atom can exceed it (one structure's are limited in :meth:`_prepared_candidates`)."""
        edge_index, unit_shifts = system.edge_index, system.unit_shifts
        limit = self.core.max_neighbors
        if not 0 < limit < system.most_neighbors:
            return edge_index, unit_shifts
        edge_system = system.system_index[edge_index[0]]
        with torch.no_grad():
            vectors = edge_vectors(
                system.positions, system.cell, edge_index, unit_shifts, edge_system
            )
            return apply_neighbor_limit(
                edge_index, unit_shifts, vectors.square().sum(-1), len(system.numbers), limit
            )

    def batch_key(self, atoms: Atoms, charge: int, spin: int) -> Hashable:
        """Composition, charge and spin: the merged experts depend on all three, so one
        batch shares them (a screening of one composition is one group)."""
        check_charge_and_spin(charge, spin)
        species, counts = np.unique(atoms.numbers, return_counts=True)
        return tuple(species.tolist()), tuple(counts.tolist()), charge, spin

    def evaluate_batch(self, system: System) -> list[Result]:
        """Systems of one composition, charge and spin in one graph (compiled once, like
        :meth:`evaluate`'s, for every batch shape): per-system energies and stresses,
        forces and per-atom energies, each system's through its own normalisers."""
        # one composition: every system has the same atoms, so system b is the b-th block
        # of ``per`` atoms
        per = int(system.sizes[0])
        self.core.prepare(torch.from_numpy(system.host_numbers[:per]), system.charge, system.spin)
        positions, cells, numbers = system.positions, system.cell, system.numbers
        edge_index, unit_shifts = self._limited_edges(system)
        edge_system = system.system_index[edge_index[0]]
        n = len(numbers)
        atoms = padded_size(n, ATOM_STEP)
        padding = atoms - n
        edges = pad_edges(edge_index, unit_shifts, cells, self.cutoff, self.bucket_size)
        extra = len(edges.edge_mask) - len(edge_system)
        energies, forces, stresses, per_atom = self._batch_runner(
            pad_atoms(positions, atoms),
            pad_systems(cells),
            torch.cat([numbers, numbers[:1].expand(padding)]),
            edges.edge_index,
            edges.unit_shifts,
            edges.edge_mask,
            atom_mask(n, atoms, numbers.device),
            torch.cat([system.system_index, system.system_index.new_zeros(padding)]),
            torch.cat([edge_system, edge_system.new_zeros(extra)]),
        )
        energies, forces, stresses, per_atom = map(
            torch.from_numpy, to_host(energies, forces[:n], stresses, per_atom[:n])
        )
        host_numbers = torch.from_numpy(system.host_numbers)
        results = []
        for b in range(len(cells)):
            atoms_of_b = slice(b * per, (b + 1) * per)
            out = self.core.outputs(
                energies[b], forces[atoms_of_b], stresses[b], per_atom[atoms_of_b],
                host_numbers[atoms_of_b], stress=True,
            )
            results.append(Result(
                float(out["energy"]), out["forces"].numpy(), out["stress"].numpy(),
                out["energies"].numpy(),
            ))
        return results

    def _prepared_candidates(self, system: System) -> Candidates:
        """The padded candidates of the current neighbour search and an edge bucket for the
        pairs within the cutoff now, made at the search's first call (one wait for the
        device, to count them). Where fairchem's neighbour limit may drop edges (an atom
        has more candidates than ``max_neighbors``), the limited edges themselves, picked
        on the host at every call."""
        if self._candidates is not None and self._candidates.search == system.search:
            return self._candidates
        keep, squared = kept_candidates(
            system.positions, system.cell, system.edge_index, system.unit_shifts, self.cutoff
        )
        edge_index, unit_shifts, search = system.edge_index, system.unit_shifts, system.search
        limit = self.core.max_neighbors
        if 0 < limit < system.most_neighbors:
            edge_index, unit_shifts = apply_neighbor_limit(
                edge_index[:, keep], unit_shifts[keep], squared[keep], len(system.numbers), limit
            )
            count, search = edge_index.shape[1], None
        else:
            count = int(keep.sum())
        edges = pad_edges(
            edge_index, unit_shifts, system.cell, self.cutoff, self.bucket_size,
            system.padding_shift,
        )
        slots = edge_slots(count, self.bucket_size, self.device)
        return Candidates(search, edges.edge_index, edges.unit_shifts, slots)

    def evaluate(self, system: System) -> Result:
        """The expert merge on the host, then the graph: edges picked from the candidates,
        the model, forces and stress; run again with a wider edge bucket in the rare call
        where more pairs are within the cutoff than at the search."""
        check_charge_and_spin(system.charge, system.spin)
        self.core.prepare(torch.from_numpy(system.host_numbers), system.charge, system.spin)
        n = len(system.numbers)
        atoms = padded_size(n, ATOM_STEP)
        padded_numbers, mask = self._padded_numbers(system.numbers, atoms)
        positions = pad_atoms(system.positions, atoms)
        candidates = self._prepared_candidates(system)
        while True:
            *outputs, count = self._runner(
                positions, system.cell, padded_numbers, candidates.edge_index,
                candidates.unit_shifts, candidates.slots, system.padding_shift, mask,
            )
            # one wait for the device; normalisers and element references apply on the host
            count, energy, forces, stress, energies = to_host(
                count, outputs[0], outputs[1][:n], outputs[2], outputs[3][:n]
            )
            if count <= len(candidates.slots):
                break
            slots = edge_slots(int(count), self.bucket_size, self.device)
            candidates = candidates._replace(slots=slots)
        if candidates.search is not None:
            self._candidates = candidates
        out = self.core.outputs(
            *map(torch.from_numpy, (energy, forces, stress, energies)),
            torch.from_numpy(system.host_numbers), system.compute_stress,
        )
        stress = out.get("stress")
        return Result(
            float(out["energy"]), out["forces"].numpy(),
            None if stress is None else stress.numpy(), out["energies"].numpy(),
        )
