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
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from ase import Atoms

from ..calculator import InvalidAtomsError, TorchCalculator, to_host
from ..registry import resolve_model_path
from .core import PETCore
from .energy import apply_reference
from .layout import Candidates, sized_candidates
from .load import PETMetadata, load_pet
from .padding import WIDTH_STEP, PaddedShape, atom_mask, pad_positions, padded_shape, padded_size
from .trace import compile_pet, graph_inputs, step_graph

__all__ = ["COMPILE_MODES", "CompiledPETCalculator", "charge_and_spin"]

COMPILE_MODES = (None, "default", "reduce-overhead")
_warned_cpu_compile = False


def _integer(key: str, value: object) -> int:
    """``value`` as an int if it is integral (floats like 1.0 included)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise InvalidAtomsError(f"atoms.info[{key!r}] must be an integer, got {value!r}")
    if not float(value).is_integer():
        raise InvalidAtomsError(f"atoms.info[{key!r}] must be an integer, got {value!r}")
    return int(value)


def charge_and_spin(info: dict) -> tuple[int, int]:
    """Total charge (``info["charge"]``, default 0) and spin multiplicity
    (``info["spin_multiplicity"]``, else ``info["spin"]``, default 1), as metatomic reads them."""
    spin_key = "spin_multiplicity" if "spin_multiplicity" in info else "spin"
    return (
        _integer("charge", info.get("charge", 0)),
        _integer(spin_key, info.get(spin_key, 1)),
    )


def _load(model: str | Path | tuple[PETCore, PETMetadata]) -> tuple[PETCore, PETMetadata]:
    if isinstance(model, tuple):
        core, metadata = model
        return core, metadata
    return load_pet(resolve_model_path(model))


class Topology(NamedTuple):
    """What one neighbour search fixes: padded candidates, the padded shape, and the
    graph inputs that follow from the shape (``arange(width)``, the real-atom mask)."""

    search: int  # the neighbour list's search counter when these were prepared
    candidates: Candidates
    shape: PaddedShape
    slots: torch.Tensor
    atom_mask: torch.Tensor

    @classmethod
    def of(cls, search: int, candidates: Candidates, shape: PaddedShape, num_atoms: int):
        device = candidates.neighbors.device
        slots = torch.arange(shape.width, device=device)
        return cls(search, candidates, shape, slots, atom_mask(num_atoms, shape.atoms, device))


class CompiledPETCalculator(TorchCalculator):
    """Energy, free energy, forces and (3D-periodic systems) stress of a PET model.

    ``model`` is a bundled model name (see :func:`fastcalc.registry.resolve_model_path`),
    a path to a metatomic export (``.pt``) or metatrain checkpoint (``.ckpt``), or a
    ``(PETCore, PETMetadata)`` pair as :func:`fastcalc.pet.load_pet` returns (the core
    is moved to ``device`` and ``dtype`` in place). Models with system conditioning
    read ``atoms.info["charge"]`` and the spin multiplicity
    (``atoms.info["spin_multiplicity"]`` or ``atoms.info["spin"]``); others ignore them.

    ``compile=True`` traces energy, forces and stress into one graph at the first call
    and compiles it with ``torch.compile(dynamic=True)``. ``compile_mode``: ``None`` means
    ``"reduce-overhead"`` on CUDA and ``"default"`` elsewhere; ``"reduce-overhead"``
    (CUDA only) replays a CUDA graph recorded per padded shape
    (:class:`fastcalc.tracing.CapturedGraphs`), ``"default"`` calls the compiled graph
    without CUDA graphs. ``compile=False`` runs the same padded inputs
    through the core eagerly. Other keyword arguments go to
    :class:`fastcalc.calculator.TorchCalculator` (``skin``, ``max_neighbors``, ...).
    """

    takes_candidates = True

    def __init__(
        self,
        model: str | Path | tuple[PETCore, PETMetadata],
        *,
        device: str | torch.device | None = None,
        dtype: str = "float32",
        compile: bool = True,
        compile_mode: str | None = None,
        **kwargs,
    ) -> None:
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {compile_mode!r}")
        core, metadata = _load(model)
        super().__init__(
            metadata.cutoff,
            supported_numbers=metadata.atomic_types,
            device=device,
            dtype=dtype,
            **kwargs,
        )
        self.core = core.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self.metadata = metadata
        # the energy reference is applied on the host, in float64, after the single transfer
        self.reference = metadata.reference()
        self._host_species = self.core.species_index.cpu().numpy()
        self.compile_mode = self._mode(compile_mode) if compile else None
        self._graph = None if compile else step_graph(self.core)
        self._topology: Topology | None = None
        self._states: dict[tuple[int, int], torch.Tensor] = {}
        # (numbers on the device, padded atoms, padded species there, species on the host)
        self._species_cache: tuple[torch.Tensor, int, torch.Tensor, np.ndarray] | None = None

    def _mode(self, requested: str | None) -> str:
        """The torch.compile mode; warns once per process that compiling on CPU is slow."""
        global _warned_cpu_compile
        if self.device.type == "cuda":
            return requested or "reduce-overhead"
        if not _warned_cpu_compile:
            warnings.warn(
                "CompiledPETCalculator compiles the model at its first call, which takes about "
                "a minute on CPU; pass compile=False to run it eagerly instead",
                UserWarning,
                stacklevel=3,
            )
            _warned_cpu_compile = True
        return "default"

    @property
    def cuda_graphs(self) -> int:
        """CUDA graphs recorded so far, one per padded shape (0 without CUDA graphs)."""
        return getattr(self._graph, "count", 0)

    def check_state(self, atoms: Atoms, tol: float = 1e-15) -> list[str]:
        changes = super().check_state(atoms, tol)
        if self.atoms is not None and self.atoms.info.get("spin_multiplicity") != atoms.info.get(
            "spin_multiplicity"
        ):
            changes.append("info")
        return changes

    def _state(self) -> tuple[int, int]:
        """Checked (charge, spin multiplicity); (0, 1) for models without conditioning."""
        if self.core.conditioning is None:
            return 0, 1
        charge, spin = charge_and_spin(self.atoms.info)
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

    def _prepare(
        self, positions: torch.Tensor, cell: torch.Tensor, edge_index: torch.Tensor,
        unit_shifts: torch.Tensor,
    ) -> Topology:
        """The topology of the current neighbour search, prepared at its first use."""
        search = self.neighbors.searches
        if self._topology is not None and self._topology.search == search:
            return self._topology
        candidates, shape = sized_candidates(
            positions, cell, edge_index, unit_shifts, self.metadata.hypers, padded_shape
        )
        self._topology = Topology.of(search, candidates, shape, len(positions))
        return self._topology

    def _species(self, numbers: torch.Tensor, atoms: int) -> tuple[torch.Tensor, np.ndarray]:
        """Species indices padded to ``atoms`` on the device, and unpadded on the host;
        made again only when ``numbers`` (cached on the device by the base class) or the
        padding changed."""
        cached = self._species_cache
        if cached is None or cached[0] is not numbers or cached[1] != atoms:
            species = self.core.species_index[numbers]  # supported: checked on the host
            padded = torch.cat([species, species.new_zeros(atoms - len(numbers))])
            host = self._host_species[self.atoms.numbers]
            self._species_cache = (numbers, atoms, padded, host)
        return self._species_cache[2], self._species_cache[3]

    def evaluate(self, positions, cell, numbers, edge_index, unit_shifts, compute_stress):
        charge, spin = self._state()
        topology = self._prepare(positions, cell, edge_index, unit_shifts)
        n = len(numbers)
        padded_positions = pad_positions(positions, topology.shape.atoms)
        padded_species, host_species = self._species(numbers, topology.shape.atoms)
        state = self._state_tensor(charge, spin)
        while True:
            inputs = graph_inputs(
                padded_positions,
                cell,
                padded_species,
                topology.candidates,
                topology.slots,
                topology.atom_mask,
                state,
            )
            with torch.enable_grad():  # tracing and the eager graph differentiate
                if self._graph is None:
                    self._graph = compile_pet(self.core, inputs, self.compile_mode)
                energies, forces, virial, status = self._graph(*inputs)
            # one copy to the host (waits for the device), detached from graph buffers
            status, energies, forces, virial = to_host(status, energies[:n], forces[:n], virial)
            needed, symmetric = status
            if not symmetric:
                raise RuntimeError("PET kept an edge but not its reverse; please report this")
            if needed <= topology.shape.width:
                break
            # an atom gained neighbours since the width was sized: widen and redo
            shape = topology.shape._replace(width=padded_size(int(needed), WIDTH_STEP))
            topology = Topology.of(topology.search, topology.candidates, shape, n)
            self._topology = topology
        result = apply_reference(
            self.reference, host_species, energies, forces, virial if compute_stress else None
        )
        return result.energy, result.forces, result.stress
