"""``CompiledPETCalculator``: PET models on fastcalc's calculator machinery.

Once per neighbour search (Verlet skin), outside compiled code: the search's candidate
pairs are sorted, paired with their reverses and padded to a bucket, and the layout
width is sized on the current geometry. Every call, one compiled graph (one CUDA graph
replay) runs the layout stage, which chooses the kept edges on the current geometry
(adaptive cutoffs solved there) without gradients, and then the model's traced graph:
network, forces and stress on that layout. The host waits for the device once per
call, at the end, for the single copy of the results and of the layout's status
(whether it fitted its width); the energy scale and the per-element composition
energies are then applied on the host in float64.

:meth:`CompiledPETCalculator.evaluate_many` packs structures into one layout of their
concatenated atoms, each atom with its own structure's cell, charge and spin, and runs
them through a second graph (:class:`fastcalc.pet.trace.BatchGraph`) with per-system
strains: any sizes, compositions, periodicities and states share a batch, as PET's
weights do not depend on them.
"""

from __future__ import annotations

import copy
import warnings
from collections import deque
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from ase import Atoms

from ..calculator import (
    InvalidAtomsError,
    Result,
    System,
    TorchCalculator,
    disk_cache,
    resolve_device,
    to_host,
)
from ..registry import resolve_model_path
from ..compile_cache import tensors_digest
from ..converted import converted
from ..precision import freeze_linears
from ..tracing import resolve_compile_mode
from .core import PETCore
from .energy import apply_reference
from .layout import Candidates, sized_candidates
from .load import PETMetadata, load_pet, pack, unpack
from ..buckets import atom_mask, pad_atoms, pad_systems, padded_size
from .padding import ATOM_STEP, WIDTH_STEP, PaddedShape, padded_shape
from .trace import BatchGraph, StepGraph, graph_inputs

__all__ = ["CompiledPETCalculator"]

#: Batches whose largest kept count sizes the next batch's layout: the widest of them, so
#: that batches alternating between two counts are not run again wider every other time.
BATCH_WIDTH_MEMORY = 8


def _legacy_compile_mode(
    compile_mode: str | None, compile: bool | None, device: torch.device
) -> str:
    """``compile_mode`` from the keywords of fastcalc 0.1 (``compile=``, ``compile_mode=None``),
    with a DeprecationWarning; ``compile=True`` kept its old meaning: compiled on any device."""
    if compile is None and compile_mode is not None:
        return compile_mode
    warnings.warn(
        "CompiledPETCalculator(compile=...) and compile_mode=None are deprecated: use "
        "compile_mode='auto', 'eager', 'default' or 'reduce-overhead'",
        DeprecationWarning,
        stacklevel=3,
    )
    if compile is False:
        return "eager"
    if compile_mode in (None, "auto"):
        return "reduce-overhead" if device.type == "cuda" else "default"
    return compile_mode


def _load(
    model: str | Path | tuple[PETCore, PETMetadata], folder: Path | None
) -> tuple[PETCore, PETMetadata]:
    """The core and metadata of ``model``; a file's conversion is kept in the cache
    ``folder`` (None: not kept), so that a later process skips metatomic's reader."""
    if isinstance(model, tuple):
        core, metadata = model
        return copy.deepcopy(core), metadata  # the caller's module stays as it was
    return converted(resolve_model_path(model), folder, load_pet, pack, unpack, "pet")


class Topology(NamedTuple):
    """What one neighbour search fixes: padded candidates, the padded shape, and the
    graph inputs that follow from the shape (``arange(width)``, the real-atom mask)."""

    search: int  # the neighbour list's search counter when these were prepared
    candidates: Candidates
    shape: PaddedShape
    slots: torch.Tensor
    atom_mask: torch.Tensor

    @classmethod
    def of(
        cls, search: int, candidates: Candidates, shape: PaddedShape, num_atoms: int
    ) -> Topology:
        """The topology of one search's padded candidates in ``shape``."""
        device = candidates.neighbors.device
        slots = torch.arange(shape.width, device=device)
        return cls(search, candidates, shape, slots, atom_mask(num_atoms, shape.atoms, device))

    def widened(self, needed: int) -> Topology:
        """The same candidates with room for ``needed`` slots per atom."""
        shape = self.shape._replace(width=padded_size(needed, WIDTH_STEP))
        return self._replace(shape=shape, slots=torch.arange(shape.width, device=self.slots.device))


def _batch_shape(atoms: int, width: int, pool: int) -> PaddedShape:
    """:func:`fastcalc.pet.padding.padded_shape` for a batch whose atoms are padded
    already (their padded rows carry their own cells)."""
    return padded_shape(atoms, width, pool)._replace(atoms=atoms)


class CompiledPETCalculator(TorchCalculator):
    """Energy, free energy, per-atom energies, forces and stress of a PET model.

    Per-atom energies (``atoms.get_potential_energies()``) are the network's, scaled,
    plus each atom's composition energy, as metatomic's; they come from the same call as
    the energy, which is their sum. Stress is defined for any cell with a volume (see
    :class:`fastcalc.calculator.TorchCalculator`).

    ``model`` is a bundled model name (see :func:`fastcalc.registry.resolve_model_path`),
    a path to a metatomic export (``.pt``) or metatrain checkpoint (``.ckpt``), or a
    ``(PETCore, PETMetadata)`` pair as :func:`fastcalc.pet.load_pet` returns (the
    calculator works on a copy of the core; the pair is left as it was). Models with
    system conditioning read ``atoms.info["charge"]`` and the spin multiplicity
    (``atoms.info["spin_multiplicity"]`` or ``atoms.info["spin"]``); others ignore them.

    ``compile_mode`` (see :func:`fastcalc.tracing.resolve_compile_mode`): ``"auto"``
    (default) replays CUDA graphs on CUDA and runs eagerly on CPU; ``"default"`` traces
    energy, forces and stress into one graph at the first call and compiles it once
    with ``torch.compile(dynamic=True)`` for every size; ``"reduce-overhead"`` (CUDA)
    also replays a CUDA graph recorded per padded shape; ``"eager"`` runs the same
    padded inputs through the core without compiling. ``calc.compile_stats`` counts
    compilations, CUDA graphs and recompiles. Other keyword arguments go to
    :class:`fastcalc.calculator.TorchCalculator` (``skin``, ``max_neighbors``, ...),
    among them ``precision``: ``"float32"`` (default) is IEEE float32 throughout, even
    with torch's global TF32 flags on; ``"tf32"`` runs the attention and feed-forward
    layers on TF32 tensor cores (CUDA), while geometry, forces and stress stay IEEE
    float32 (:mod:`fastcalc.precision`).

    Example::

        from ase.build import bulk
        atoms = bulk("Cu", cubic=True).repeat(3)
        atoms.calc = CompiledPETCalculator("pet-demo-cu")
        print(atoms.get_potential_energy(), atoms.get_forces()[0])
    """

    takes_candidates = True
    evaluates_batches = True
    implemented_properties = [*TorchCalculator.implemented_properties, "energies"]
    default_parameters = {**TorchCalculator.default_parameters, "compile_mode": "auto"}

    def __init__(
        self,
        model: str | Path | tuple[PETCore, PETMetadata],
        *,
        device: str | torch.device | None = None,
        dtype: str = "float32",
        compile_mode: str | None = "auto",
        compile: bool | None = None,
        **kwargs,
    ) -> None:
        target = resolve_device(device)
        compile_mode = _legacy_compile_mode(compile_mode, compile, target)
        resolved = resolve_compile_mode(compile_mode, target)
        cache = disk_cache(resolved, kwargs.get("cache_dir"))
        core, metadata = _load(model, None if cache is None else cache.folder)
        super().__init__(
            metadata.cutoff,
            supported_numbers=metadata.atomic_types,
            device=device,
            dtype=dtype,
            **kwargs,
        )
        core = core.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self.core = freeze_linears(core)
        self.metadata = metadata
        # the energy reference is applied on the host, in float64, after the single transfer
        self.reference = metadata.reference()
        self._host_species = self.core.species_index.cpu().numpy()
        self.compile_mode = resolved
        self._runner = self.graph_runner(StepGraph(self.core), self.compile_mode)
        self._batch_runner = self.graph_runner(BatchGraph(self.core), self.compile_mode, "batch")
        name = str(model) if isinstance(model, (str, Path)) else "PETCore"
        self.parameters.update(model=name, compile_mode=compile_mode)
        self._topology: Topology | None = None
        self._states: dict[tuple[int, int], torch.Tensor] = {}
        # (numbers on the device, padded atoms, padded species there, species on the host)
        self._species_cache: tuple[torch.Tensor, int, torch.Tensor, np.ndarray] | None = None
        # the largest kept count per atom of each recent batch: the next batch's width is
        # the largest of them
        self._batch_widths: deque[int] = deque(maxlen=BATCH_WIDTH_MEMORY)

    def model_digest(self) -> str:
        """Digest of the core's weights and hyper-parameters (names its compiled code)."""
        return tensors_digest(self.core.state_dict(), self.core.hypers)

    def _state(self, charge: int, spin: int) -> tuple[int, int]:
        """Checked (charge, spin multiplicity); (0, 1) for models without conditioning."""
        if self.core.conditioning is None:
            return 0, 1
        try:
            self.core.conditioning.check(charge, spin)
        except ValueError as error:
            raise InvalidAtomsError(str(error)) from error
        return charge, spin

    def _state_tensor(self, charge: int, spin: int) -> torch.Tensor:
        """The graph's [charge, spin multiplicity] input, copied to the device once per state."""
        key = (charge, spin)
        if key not in self._states:
            self._states[key] = torch.tensor(key, device=self.device)
        return self._states[key]

    def _prepare(self, system: System) -> Topology:
        """The topology of the current neighbour search, prepared at its first use."""
        if self._topology is not None and self._topology.search == system.search:
            return self._topology
        candidates, shape = sized_candidates(
            system.positions, system.cell, system.edge_index, system.unit_shifts,
            self.metadata.hypers, padded_shape,
        )
        self._topology = Topology.of(system.search, candidates, shape, len(system.positions))
        return self._topology

    def _species(
        self, numbers: torch.Tensor, host_numbers: np.ndarray, atoms: int
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Species indices padded to ``atoms`` on the device, and unpadded on the host;
        made again only when ``numbers`` (cached on the device by the base class) or the
        padding changed."""
        cached = self._species_cache
        if cached is None or cached[0] is not numbers or cached[1] != atoms:
            species = self.core.species_index[numbers]  # supported: checked on the host
            padded = torch.cat([species, species.new_zeros(atoms - len(numbers))])
            host = self._host_species[host_numbers]
            self._species_cache = (numbers, atoms, padded, host)
        return self._species_cache[2], self._species_cache[3]

    @staticmethod
    def _fitted(
        run: Callable[[Topology], list[np.ndarray]], topology: Topology
    ) -> tuple[Topology, int, list[np.ndarray]]:
        """``run(topology)`` (the graph's outputs on the host, its layout status first),
        redone wider while an atom keeps more neighbours than the layout has slots (it
        gained some since the width was sized); the topology that fitted, the largest
        kept count per atom, and the outputs."""
        while True:
            (needed, symmetric), *outputs = run(topology)
            if not symmetric:
                raise RuntimeError("PET kept an edge but not its reverse; please report this")
            if needed <= topology.shape.width:
                return topology, int(needed), outputs
            topology = topology.widened(int(needed))

    def evaluate(self, system: System) -> Result:
        """The layout and the model in one compiled call (one replay under CUDA graphs)."""
        state = self._state_tensor(*self._state(system.charge, system.spin))
        n = len(system.numbers)
        topology = self._prepare(system)
        atoms = topology.shape.atoms
        padded_positions = pad_atoms(system.positions, atoms)
        padded_species, host_species = self._species(system.numbers, system.host_numbers, atoms)

        def run(topology: Topology) -> list[np.ndarray]:
            inputs = graph_inputs(
                padded_positions,
                system.cell,
                padded_species,
                topology.candidates,
                topology.slots,
                topology.atom_mask,
                state,
            )
            energies, forces, virial, status = self._runner(*inputs)
            # one copy to the host (waits for the device), detached from graph buffers
            return to_host(status, energies[:n], forces[:n], virial)

        self._topology, _, (energies, forces, virial) = self._fitted(run, topology)
        result = apply_reference(
            self.reference, host_species, energies, forces,
            virial if system.compute_stress else None,
        )
        return Result(result.energy, result.forces, result.stress, result.energies)

    def batch_key(self, atoms: Atoms, charge: int, spin: int) -> Hashable:
        """The same for every structure: PET's weights depend on no structure, and charge
        and spin enter per system, so any structures share a batch. States outside the
        model's tables are refused here."""
        self._state(charge, spin)
        return None

    def evaluate_batch(self, system: System) -> list[Result]:
        """The systems of ``system`` in one layout and one call of the batch graph
        (compiled once for every batch shape). Atoms, slots and candidate pairs are padded
        as in :meth:`evaluate`, systems with empty ones (:func:`fastcalc.buckets.pad_systems`);
        padded atoms belong to system 0, with no neighbours and no energy. The layout is
        as wide as the widest of the last :data:`BATCH_WIDTH_MEMORY` batches needed (the
        first batch's width is solved on the host), and a batch that needs more is run
        again wider: batches after the first skip the host's solve of adaptive cutoffs,
        which keep about the same count everywhere."""
        n, count = len(system.numbers), len(system.cell)
        atoms = padded_size(n, ATOM_STEP)
        positions = pad_atoms(system.positions, atoms)
        system_index = pad_atoms(system.system_index, atoms)
        cells = pad_systems(system.cell)
        candidates, shape = sized_candidates(
            positions, cells[system_index], system.edge_index, system.unit_shifts,
            self.metadata.hypers, _batch_shape, max(self._batch_widths, default=None),
        )
        # empty systems get (0, 1), a state every model accepts
        spare = [(0, 1)] * (len(cells) - count)
        states = torch.tensor(
            [self._state(int(c), int(s)) for c, s in system.states] + spare, device=self.device
        )
        species = pad_atoms(self.core.species_index[system.numbers], atoms)

        def run(topology: Topology) -> list[np.ndarray]:
            energies, forces, virials, status = self._batch_runner(
                positions, cells, system_index, topology.atom_mask, states, species,
                *topology.candidates, topology.slots,
            )
            return to_host(status, energies[:n], forces[:n], virials[:count])

        topology = Topology.of(system.search, candidates, shape, n)
        _, needed, (energies, forces, virials) = self._fitted(run, topology)
        self._batch_widths.append(needed)
        host_species = self._host_species[system.host_numbers]
        ends = np.cumsum(system.sizes)
        results = []
        for b, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
            out = apply_reference(
                self.reference, host_species[start:end], energies[start:end],
                forces[start:end], virials[b],
            )
            results.append(Result(out.energy, out.forces, out.stress, out.energies))
        return results
