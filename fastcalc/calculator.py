"""The ASE calculator machinery shared by every fastcalc model.

Data flows one way: ``Atoms`` -> checks -> :class:`System` (tensors on the model's
device, the neighbour list, charge and spin) -> the model's
:meth:`TorchCalculator.evaluate` -> :class:`Result` (float64 on the host) -> ASE's
``results`` (eV, eV/Å, and stress as ASE's Voigt 6-vector in eV/Å³). That is the whole
contract between the calculator and a model. :class:`PotentialCalculator` plugs any
torch energy function into the same path.
"""

from __future__ import annotations

import difflib
import inspect
import math
import threading
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import torch
from ase import Atoms
from ase.calculators.calculator import (
    Calculator,
    InputError,
    PropertyNotImplementedError,
    all_changes,
    equal,
)
from ase.data import chemical_symbols
from ase.stress import full_3x3_to_voigt_6_stress

from .buckets import PaddedEdges, check_positive_int, pad_edges, padding_cell, padding_shift
from .changes import system_changes
from .geometry import energy_forces_stress
from .compile_cache import CacheKey, CompileCache
from .neighbors import HostGeometry, NeighborOverflowError, VerletNeighborList, estimate_crowding
from .precision import check_precision, matmul_precision
from .tracing import GraphRunner

T = TypeVar("T")

__all__ = [
    "InvalidAtomsError",
    "PotentialCalculator",
    "Result",
    "System",
    "TorchCalculator",
    "atom_chunks",
    "even_chunks",
    "charge_and_spin",
    "resolve_device",
    "to_host",
    "why_no_cuda",
]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: Keywords of ASE's ``Calculator`` constructor, which fastcalc's calculators pass on.
_ASE_KEYWORDS = frozenset(inspect.signature(Calculator.__init__).parameters) - {"self", "kwargs"}


class InvalidAtomsError(InputError, ValueError):
    """The Atoms cannot be evaluated (NaN positions, a degenerate cell, ...)."""


@dataclass(frozen=True)
class System:
    """Everything a model may read about the structure of one call.

    N atoms, E pairs, B systems (B = 1 for one ``Atoms``: ``system_index`` all zero).
    Tensors are on the model's device, floating ones in its dtype:

    - ``positions`` (N, 3) Å; ``cell`` (3, 3) Å, with a zero vector of a non-periodic axis
      replaced (:func:`fastcalc.buckets.padding_cell`), so a model can pad edges with it;
      ``pbc`` (3,) bool; ``numbers`` (N,) int64 atomic numbers, ``host_numbers`` the same
      on the host; ``system_index`` (N,) int64;
    - ``edge_index`` (2, E) int64 (row 0 the centre atom) and ``unit_shifts`` (E, 3) int64,
      the pairs closer than the cutoff in ASE's ``"ijS"`` convention (less those of zero
      length for a model with ``drops_zero_length_edges``), or, for a model with
      ``takes_candidates``, the Verlet candidates (pairs within cutoff + skin, the same
      tensors while ``search``, the neighbour list's search counter, stays the same);
      ``most_neighbors`` bounds the pairs of any one atom in that search;
    - ``charge`` and ``spin`` (multiplicity 2S + 1) from ``atoms.info``, integers (of the
      first system of a batch); ``states`` (B, 2) int64 on the host, every system's
      [charge, spin] for a batch (None for one ``Atoms``), which a model whose
      :meth:`TorchCalculator.batch_key` mixes states reads; ``sizes`` (B,) on the host,
      every system's atom count for a batch (None for one ``Atoms``), so that a model
      slices its results per system without reading ``system_index`` back;
    - ``compute_stress``: whether the stress (1/V) dE/dε is defined, that is, the three
      cell vectors are linearly independent (any pbc); ``cell`` is then the user's, no
      vector replaced, so V is its volume;
    - ``padding_shift`` (3,) int64, the unit shift of padded edges for ``cell``
      (:func:`fastcalc.buckets.padding_shift`), made on the host so that padding costs
      the device nothing; None for a batch (:func:`fastcalc.buckets.pad_edges` then
      makes it).
    """

    positions: torch.Tensor
    cell: torch.Tensor
    pbc: torch.Tensor
    numbers: torch.Tensor
    host_numbers: np.ndarray
    system_index: torch.Tensor
    edge_index: torch.Tensor
    unit_shifts: torch.Tensor
    search: int
    most_neighbors: int
    charge: int
    spin: int
    compute_stress: bool
    states: np.ndarray | None = None
    sizes: np.ndarray | None = None
    padding_shift: torch.Tensor | None = None


@dataclass(frozen=True)
class Result:
    """A model's answer for one :class:`System`, on the host in float64: ``energy`` (eV),
    ``forces`` (N, 3) eV/Å, ``stress`` (3, 3) eV/Å³ in ASE's sign convention (positive
    under tension), None unless asked for, and ``energies`` (N,) eV, per-atom energies
    summing to ``energy``, None for models that do not provide them."""

    energy: float
    forces: np.ndarray
    stress: np.ndarray | None = None
    energies: np.ndarray | None = None

    @classmethod
    def from_tensors(
        cls, energy: torch.Tensor, forces: torch.Tensor, stress: torch.Tensor | None
    ) -> Result:
        """A result from tensors on any device, copied to the host in one transfer."""
        energy, forces, stress = to_host(energy, forces, stress)
        return cls(float(energy), forces, stress)


def why_no_cuda() -> str | None:
    """Why CUDA cannot be used here, or ``None`` when it can."""
    if torch.cuda.is_available():
        return None
    return "torch was built without CUDA" if torch.version.cuda is None else "no GPU found"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device``, or CUDA when available and CPU otherwise for ``None``. A CUDA device
    that this machine lacks raises ``ValueError`` saying so, before any model is loaded."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type != "cuda":
        return resolved
    if (why := why_no_cuda()) is not None:
        raise ValueError(f"device={str(device)!r}: CUDA is not available here ({why}); "
                         "use device='cpu'")
    if resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ValueError(f"device={str(device)!r}: this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s), numbered from 0")
    return resolved


def check_positions(atoms: Atoms) -> None:
    """Raise :class:`InvalidAtomsError` if ``atoms`` is empty or a position is not finite."""
    if len(atoms) == 0:
        raise InvalidAtomsError("the Atoms object is empty: there is nothing to compute")
    finite = np.isfinite(atoms.positions)
    if finite.all():  # checked every call: the common case costs one pass
        return
    bad = np.flatnonzero(~finite.all(axis=1))
    raise InvalidAtomsError(f"positions of atoms {bad[:10].tolist()} are NaN or infinite")


def check_structure(atoms: Atoms, supported_numbers: Collection[int] | None) -> None:
    """Raise :class:`InvalidAtomsError` naming what makes the cell, ``pbc`` or the elements
    of ``atoms`` unusable."""
    cell = atoms.cell.array
    if not np.isfinite(cell).all():
        raise InvalidAtomsError(f"the cell has NaN or infinite entries: {cell.tolist()}")
    periodic = cell[atoms.pbc]
    if len(periodic) and np.linalg.matrix_rank(periodic, tol=1e-8) < len(periodic):
        axes = "".join("abc"[a] for a in np.flatnonzero(atoms.pbc))
        raise InvalidAtomsError(
            f"pbc={atoms.pbc.tolist()} but the periodic cell vectors ({axes}) are zero or "
            f"linearly dependent: cell={cell.tolist()}; set a cell or turn pbc off"
        )
    if supported_numbers is not None:
        unsupported = sorted(set(atoms.numbers.tolist()) - set(supported_numbers))
        if unsupported:
            names = ", ".join(_symbol(z) for z in unsupported)
            allowed = ", ".join(_symbol(z) for z in sorted(supported_numbers))
            raise InvalidAtomsError(f"the model does not support {names}; it supports {allowed}")


def _integer(key: str, value: object) -> int:
    """``value`` as an int if it is integral (floats like 1.0 included)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise InvalidAtomsError(f"atoms.info[{key!r}] must be an integer, got {value!r}")
    if not float(value).is_integer():
        raise InvalidAtomsError(f"atoms.info[{key!r}] must be an integer, got {value!r}")
    return int(value)


def charge_and_spin(info: dict, default_spin: int = 1) -> tuple[int, int]:
    """Total charge (``info["charge"]``, default 0) and spin multiplicity 2S + 1
    (``info["spin_multiplicity"]`` or ``info["spin"]``, default ``default_spin``), as
    integers; integral floats such as ``1.0`` count, anything else is an
    :class:`InvalidAtomsError`, and so are the two spin keys with different values
    (metatomic reads the first, fairchem only the second). Models check the ranges they
    accept."""
    spins = {key: _integer(key, info[key]) for key in ("spin_multiplicity", "spin") if key in info}
    if len(set(spins.values())) > 1:
        raise InvalidAtomsError(
            f"atoms.info gives spin_multiplicity={spins['spin_multiplicity']} and "
            f"spin={spins['spin']}: both are the spin multiplicity 2S + 1; keep one"
        )
    return _integer("charge", info.get("charge", 0)), next(iter(spins.values()), default_spin)


def spans_volume(cell: np.ndarray) -> bool:
    """Whether the three vectors of ``cell`` are linearly independent (same tolerance as
    :func:`check_structure`): then the stress (1/V) dE/dε of that cell is defined."""
    return bool(np.linalg.matrix_rank(cell, tol=1e-8) == 3)


#: The share of a GPU's free memory that one batch of :meth:`TorchCalculator.evaluate_many`
#: may be estimated to need. A new batch shape runs once outside the CUDA graph memory that
#: the shapes met before keep, so two batches' memory coexist, and estimates run low by up
#: to a quarter (H200, UMA: 83 GiB kept by the graph of 91 structures estimated at 67 GiB).
BATCH_MEMORY_SHARE = 0.35


def free_memory(device: torch.device) -> int | None:
    """Bytes a model may still allocate on a CUDA ``device``: the device's free memory plus
    what torch's allocator holds unused. None on the CPU, where the system pages instead of
    failing at once."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _symbol(number: int) -> str:
    return chemical_symbols[number] if 0 <= number < len(chemical_symbols) else f"Z={number}"


def disk_cache(mode: str, cache_dir: str | Path | Literal[False] | None) -> CompileCache | None:
    """The disk cache a calculator compiling in ``mode`` uses with its ``cache_dir``
    (None, the default folder; False, none): none for eager calculators."""
    if mode == "eager" or cache_dir is False:
        return None
    return CompileCache(cache_dir)


def _recorded_folder(cache_dir: str | Path | Literal[False] | None) -> str | Literal[False] | None:
    """``cache_dir`` as ``parameters`` records it: a folder as a string (trajectories store
    strings), None (the default folder) and False (no disk cache) as they are."""
    return cache_dir if cache_dir is None or cache_dir is False else str(cache_dir)


def _refuse_unknown(cls: type, kwargs: dict) -> None:
    """``TypeError`` naming the keywords in ``kwargs`` that neither ``cls``'s constructors
    nor ASE's take (ASE would keep them in ``parameters`` without effect), with the
    nearest known names: a misspelt setting must not be ignored."""
    unknown = sorted(set(kwargs) - _ASE_KEYWORDS)
    if not unknown:
        return
    known = set(_ASE_KEYWORDS)
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and issubclass(klass, TorchCalculator):
            known.update(inspect.signature(klass.__init__).parameters)
    known -= {"self", "kwargs"}
    hints = [
        f"{name!r} (did you mean {' or '.join(map(repr, close))}?)" if close else repr(name)
        for name in unknown
        for close in [difflib.get_close_matches(name, sorted(known), n=2)]
    ]
    raise TypeError(f"{cls.__name__} got unknown keyword arguments: {', '.join(hints)}")


class TorchCalculator(Calculator):
    """Base of fastcalc's ASE calculators; subclasses implement :meth:`evaluate`.

    ``cutoff`` is the model's interaction range in Å. ``skin`` (default 0.5 Å)
    is the Verlet skin of the neighbor list: the search is redone only after an
    atom moved more than ``skin / 2``; results do not depend on it.
    ``max_neighbors`` bounds the neighbours per atom within ``cutoff + skin``: an
    :class:`InvalidAtomsError` beyond it, typically wrong units. Absurd geometries (far
    denser than matter, far more neighbours than the limit, a nearly degenerate cell) are
    refused before the search from an estimate
    (:func:`fastcalc.neighbors.estimate_crowding`), so they cannot hang it or run it out of
    memory. ``precision`` (:mod:`fastcalc.precision`): ``"float32"``
    (default) keeps every float32 matrix product IEEE, even when torch's global TF32
    flags are on; ``"tf32"`` runs the network's own products on TF32 tensor cores (CUDA,
    dtype float32), faster and less accurate; ``"3xtf32"`` runs each of the network's
    linear maps as three TF32 products (CUDA, dtype float32), float32's accuracy on tensor
    cores. ``cache_dir``: where compiled models are
    stored for the next process (:mod:`fastcalc.compile_cache`; None: ``$FASTCALC_CACHE_DIR``
    or ``~/.cache/fastcalc``; False: no disk cache). ``compile_in_background`` (default
    True; needs the disk cache): the first calls run uncompiled instead of waiting while a
    model not yet in the disk cache is compiled, by another process
    (:mod:`fastcalc.background_build`), or while one found there is loaded (a thread first
    imports the compiler); False: the first call compiles or loads.

    Stress is (1/V) dE/dε under a homogeneous strain ε of positions and cell, V the
    volume of the cell as given, whenever its three vectors are linearly independent,
    periodic or not: a slab's or a wire's stress then depends on the vacuum in its cell,
    as fairchem's and metatomic's do. A cell without volume (a zero vector on a
    non-periodic axis) raises ``PropertyNotImplementedError`` for stress.
    """

    implemented_properties = ["energy", "free_energy", "forces", "stress"]
    #: The model (set by subclasses): holds every tensor its compiled functions read.
    core: torch.nn.Module
    #: The model's functions for one structure and for batches (set by subclasses that
    #: compile: :meth:`graph_runner`).
    _runner: GraphRunner
    _batch_runner: GraphRunner
    #: Spin multiplicity when ``atoms.info`` gives none.
    default_spin = 1
    #: What ``todict()`` (and so ASE's trajectories) records: the constructor's settings.
    default_parameters = {
        "device": None, "dtype": "float32", "precision": "float32", "skin": 0.5,
        "max_neighbors": 4096, "cache_dir": None, "compile_in_background": True,
    }
    #: Hand :meth:`evaluate` the Verlet candidates (pairs within cutoff + skin, the same
    #: tensors until the next search) instead of the pairs within the cutoff.
    takes_candidates = False
    #: The model implements :meth:`evaluate_batch`; :meth:`evaluate_many` evaluates the
    #: others one structure at a time.
    evaluates_batches = False
    #: Leave pairs of zero length (coincident atoms) out of the edges handed to
    #: :meth:`evaluate` (the candidates of ``takes_candidates`` keep them).
    drops_zero_length_edges = False

    def __init__(
        self,
        cutoff: float,
        *,
        supported_numbers: Collection[int] | None = None,
        device: str | torch.device | None = None,
        dtype: str = "float32",
        precision: str = "float32",
        skin: float = 0.5,
        max_neighbors: int = 4096,
        cache_dir: str | Path | Literal[False] | None = None,
        compile_in_background: bool = True,
        **kwargs,
    ) -> None:
        _refuse_unknown(type(self), kwargs)
        super().__init__(**kwargs)
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.cutoff = float(cutoff)
        self.supported_numbers = None if supported_numbers is None else frozenset(supported_numbers)
        self.device = resolve_device(device)
        self.dtype = _DTYPES[dtype]
        self.precision = check_precision(precision, self.dtype)
        self.neighbors = VerletNeighborList(
            self.cutoff, skin, max_neighbors, drop_zero_length=self.drops_zero_length_edges
        )
        # the searches of evaluate_many's batches: one object, so that the neighbour matrix
        # width it learnt carries over from batch to batch instead of being found again
        self._batch_neighbors = VerletNeighborList(
            self.cutoff, 0.0, max_neighbors, drop_zero_length=self.drops_zero_length_edges
        )
        self.parameters.update(
            device=str(self.device), dtype=dtype, precision=precision, skin=skin,
            max_neighbors=max_neighbors, cache_dir=_recorded_folder(cache_dir),
            compile_in_background=compile_in_background,
        )
        self.cache_dir = cache_dir
        self.compile_in_background = compile_in_background
        self._device_copies: dict[str, tuple[np.ndarray, torch.Tensor]] = {}
        # numbers, cell and pbc of the last structure that passed, and whether it has a volume
        self._checked: tuple[np.ndarray, np.ndarray, np.ndarray, bool] | None = None
        self._zeros: torch.Tensor | None = None
        # the user's cell last seen, the model's cell in its place (or None) and the
        # padding shift (see _padding)
        self._padded_cell: tuple[np.ndarray, torch.Tensor | None, torch.Tensor] | None = None
        self._digest: str | None = None
        self._lock = threading.RLock()

    def set(self, **kwargs) -> dict:
        """ASE's ``set``, for settings as they are: a calculator's settings are fixed when
        it is built (they choose its neighbour list and compiled code), so a changed or
        unknown one raises ``ValueError`` naming it, rather than being recorded in
        ``parameters`` without effect. Build a new calculator to change one."""
        changed = sorted(
            key for key, value in kwargs.items()
            if key not in self.parameters or not equal(value, self.parameters[key])
        )
        if changed:
            raise ValueError(
                f"{type(self).__name__}.set cannot change {', '.join(changed)}: settings are "
                "fixed when the calculator is built; build a new calculator instead"
            )
        return {}

    def get_property(
        self, name: str, atoms: Atoms | None = None, allow_calculation: bool = True
    ) -> object:
        """ASE's ``get_property``, one thread at a time: a calculator shared by threads
        (models merge weights in place, results are stored on the calculator) gives each
        caller the results of its own ``atoms``."""
        with self._lock:
            return super().get_property(name, atoms, allow_calculation)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]  # a lock cannot be copied; a copy gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def evaluate(self, system: System) -> Result:
        """Energy, forces and (if ``system.compute_stress``) stress of ``system``."""
        raise NotImplementedError

    def evaluate_batch(self, system: System) -> list[Result]:
        """One :class:`Result` per system of a batched ``system`` (``cell`` (B, 3, 3),
        ``pbc`` (B, 3), atoms sorted by ``system_index``; the systems share what
        :meth:`batch_key` groups by), stresses included; models that batch implement it
        (:meth:`evaluate_many` evaluates the others one structure at a time)."""
        raise NotImplementedError(f"{type(self).__name__} does not evaluate batches")

    def batch_key(self, atoms: Atoms, charge: int, spin: int) -> Hashable:
        """What structures must share to be evaluated in one batch (default: charge and
        spin); raises :class:`InvalidAtomsError` for a state the model refuses."""
        return charge, spin

    def evaluate_many(
        self, structures: Sequence[Atoms], *, max_atoms: int = 8192
    ) -> list[dict[str, object]]:
        """Energy, free energy, forces, per-atom energies (when the model gives them) and,
        for cells with a volume, stress (ASE's Voigt order) of every structure, in order,
        each equal to this calculator's result for that structure alone.

        Structures that :meth:`batch_key` puts together are packed into batched graphs
        of at most ``max_atoms`` atoms each (a larger structure runs alone), the atoms
        spread evenly over as few batches as the limits allow; fewer, larger
        calls keep a GPU busy where small structures one at a time leave it idle. A
        structure that cannot be evaluated gets ``{"error": InvalidAtomsError(...)}`` and
        the others are still computed. The calculator's own ``results`` are untouched.
        Models without :meth:`evaluate_batch` evaluate one at a time. On a GPU, a model
        with a :meth:`memory_estimate` also cuts its batches so that their estimated memory
        stays within a third of the free memory (:data:`BATCH_MEMORY_SHARE`); a batch that
        still runs out of memory is evaluated again in halves.
        """
        check_positive_int(max_atoms, "max_atoms")
        with self._lock:
            out: list[dict[str, object] | None] = [None] * len(structures)
            groups: dict[Hashable, list[int]] = {}
            volumes: dict[int, bool] = {}
            for index, atoms in enumerate(structures):
                try:
                    check_positions(atoms)
                    volumes[index] = self._check_structure(atoms)
                    key = self.batch_key(atoms, *charge_and_spin(atoms.info, self.default_spin))
                except InvalidAtomsError as error:
                    out[index] = {"error": error}
                    continue
                groups.setdefault(key, []).append(index)
            sizes = [len(atoms) for atoms in structures]
            needs, budget = self._batch_memory(structures, groups)
            for members in groups.values():
                cost = None if needs is None else needs.__getitem__
                for chunk in even_chunks(members, sizes.__getitem__, max_atoms, cost, budget):
                    self._evaluate_chunk(structures, chunk, volumes, out)
            return out

    def _evaluate_chunk(
        self,
        structures: Sequence[Atoms],
        chunk: list[int],
        volumes: dict[int, bool],
        out: list[dict[str, object] | None],
    ) -> None:
        """Evaluate the structures ``chunk`` as one batch into ``out``; if the batch is
        refused (one structure crowded beyond the limit, say), each alone, so that only
        the culprit gets the error; if it runs out of GPU memory, in halves."""
        if not self.evaluates_batches:  # one at a time
            for index in chunk:
                out[index] = self._alone(structures[index], volumes[index])
            return
        try:
            system = self._batch_system([structures[i] for i in chunk])
            with matmul_precision(self.precision):
                results = self.evaluate_batch(system)
        except InvalidAtomsError as error:
            if len(chunk) == 1:
                out[chunk[0]] = {"error": error}
                return
            for index in chunk:
                self._evaluate_chunk(structures, [index], volumes, out)
            return
        except torch.OutOfMemoryError as error:
            if len(chunk) == 1:
                out[chunk[0]] = {"error": error}
                return
            torch.cuda.empty_cache()
            half = len(chunk) // 2
            for part in (chunk[:half], chunk[half:]):
                self._evaluate_chunk(structures, part, volumes, out)
            return
        for index, result in zip(chunk, results):
            entry: dict[str, object] = {
                "energy": result.energy, "free_energy": result.energy, "forces": result.forces
            }
            if volumes[index] and result.stress is not None:
                entry["stress"] = full_3x3_to_voigt_6_stress(result.stress)
            if result.energies is not None:
                entry["energies"] = result.energies
            out[index] = entry

    def _alone(self, atoms: Atoms, has_volume: bool) -> dict[str, object]:
        """``atoms``'s results through :meth:`calculate`, for a model without batches; the
        calculator's own ``atoms`` and ``results`` are put back."""
        saved = self.atoms, self.results
        try:
            self.calculate(atoms.copy(), ["energy", "forces"] + ["stress"] * has_volume)
            return dict(self.results)
        except InvalidAtomsError as error:
            return {"error": error}
        finally:
            self.atoms, self.results = saved

    def _batch_system(self, structures: list[Atoms]) -> System:
        """The batched :class:`System` of ``structures``, with the pairs within the cutoff
        found in one search."""
        dtype, device = self.dtype, self.device
        positions = torch.tensor(
            np.concatenate([a.positions for a in structures]), dtype=dtype, device=device
        )
        host_cells = np.stack([a.cell.array for a in structures])
        cells = torch.tensor(host_cells, dtype=dtype, device=device)
        pbc = torch.tensor(np.stack([a.pbc for a in structures]), device=device)
        host_numbers = np.concatenate([a.numbers for a in structures])
        sizes = np.array([len(a) for a in structures])
        # made on the host: one copy, where repeat_interleave on the device waits for it
        system_index = torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes)).to(device)
        search = self._batch_neighbors
        try:
            edge_index, unit_shifts = search(positions, cells, pbc, system_index)
        except NeighborOverflowError as error:
            raise InvalidAtomsError(str(error)) from error
        states = np.array(
            [charge_and_spin(a.info, self.default_spin) for a in structures], dtype=np.int64
        )
        return System(
            positions=positions,
            cell=padding_cell(cells, self.cutoff),
            pbc=pbc,
            numbers=torch.tensor(host_numbers, dtype=torch.long, device=device),
            host_numbers=host_numbers,
            system_index=system_index,
            edge_index=edge_index,
            unit_shifts=unit_shifts,
            search=search.searches,
            most_neighbors=search.most_candidates,
            charge=int(states[0, 0]),
            spin=int(states[0, 1]),
            compute_stress=True,
            states=states,
            sizes=sizes,
        )

    @property
    def compile_stats(self) -> dict[str, int]:
        """``{"compilations", "cuda_graphs", "recompiles", "from_cache"}`` of the function
        that evaluates one structure (see :attr:`fastcalc.tracing.GraphRunner.stats`)."""
        return self._runner.stats

    @property
    def batch_compile_stats(self) -> dict[str, int]:
        """The same of the function that evaluates batches (:meth:`evaluate_many`)."""
        return self._batch_runner.stats

    def wait_for_compilation(self) -> None:
        """Block until the model's functions being compiled by another process or loaded
        (``compile_in_background``) are ready: the next call runs compiled code."""
        for name in ("_runner", "_batch_runner"):
            runner = getattr(self, name, None)
            if runner is not None:
                runner.wait()

    def model_digest(self) -> str:
        """A digest of the model's weights and hyper-parameters (see
        :func:`fastcalc.compile_cache.tensors_digest`), naming its compiled code on disk;
        models that compile implement it."""
        raise NotImplementedError

    def graph_runner(
        self, fn: Callable[..., tuple[torch.Tensor, ...]], mode: str, graph: str = "single"
    ) -> GraphRunner:
        """The :class:`fastcalc.tracing.GraphRunner` of ``fn`` (the model's function
        ``graph``: ``"single"`` or ``"batch"``) in ``mode``, with this calculator's disk
        cache of compiled models unless ``cache_dir`` is False, compiled in the background
        with ``compile_in_background``. ``fn`` reads no tensors but its inputs and those of
        the model's ``core``."""
        cache = disk_cache(mode, self.cache_dir)
        if cache is None:
            return GraphRunner(fn, mode)
        return GraphRunner(fn, mode, cache, partial(self._cache_key, graph), owner=self.core,
                           background=self.compile_in_background)

    def _cache_key(self, graph: str) -> CacheKey:
        """The disk cache key of this calculator's compiled function ``graph``."""
        if self._digest is None:  # a pass over the weights: once, for all graphs
            self._digest = self.model_digest()
        mode = getattr(self, "compile_mode", "default")
        return CacheKey.create(self._digest, self.device, self.dtype, self.precision, mode, graph)

    def _on_device(self, name: str, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """Device copy of a host array that rarely changes (numbers, pbc): copied again only
        when it changed, so an MD step does not wait for these transfers."""
        host, device = self._device_copies.get(name, (None, None))
        if host is None or not np.array_equal(host, array):
            host = np.array(array, copy=True)
            device = torch.tensor(host, dtype=dtype, device=self.device)
            self._device_copies[name] = (host, device)
        return device

    def _padding(self, cell: np.ndarray) -> tuple[torch.Tensor | None, torch.Tensor]:
        """For the user's ``cell``: the cell the model sees in its place if a vector is
        zero (:func:`padding_cell`; else None, the cell itself) and the unit shift of padded
        edges for the model's cell (:func:`padding_shift`), both on the device; made on the
        host, and again only when the cell changed (an MD step keeps it)."""
        if self._padded_cell is None or not np.array_equal(self._padded_cell[0], cell):
            model_cell = torch.tensor(cell, dtype=self.dtype)
            replaced = None
            if not cell.any(axis=1).all():  # a zero cell vector: no stress then
                model_cell = padding_cell(model_cell, self.cutoff)
                replaced = model_cell.to(self.device)
            shift = padding_shift(model_cell, self.cutoff).to(self.device)
            self._padded_cell = (np.array(cell, copy=True), replaced, shift)
        return self._padded_cell[1], self._padded_cell[2]

    def _system_index(self, atoms: int) -> torch.Tensor:
        """``system_index`` of one system of ``atoms`` atoms (zeros), made when the count
        changes rather than every call."""
        if self._zeros is None or len(self._zeros) != atoms:
            self._zeros = torch.zeros(atoms, dtype=torch.long, device=self.device)
        return self._zeros

    def memory_estimate(self, atoms: int, neighbors: float) -> float | None:
        """Bytes the model needs for ``atoms`` atoms with ``neighbors`` neighbours each
        within the cutoff, or None where the model gives no estimate."""
        return None

    def _batch_memory(
        self, structures: Sequence[Atoms], groups: dict[Hashable, list[int]]
    ) -> tuple[dict[int, float] | None, float]:
        """Estimated memory of each grouped structure and the memory a batch may use, on a
        GPU for a model with a :meth:`memory_estimate`; else no estimates and no limit."""
        free = free_memory(self.device)
        if free is None:
            return None, math.inf
        needs: dict[int, float] = {}
        for index in (index for members in groups.values() for index in members):
            need, _ = self._memory_need(structures[index])
            if need is None:
                return None, math.inf
            needs[index] = need
        return needs, BATCH_MEMORY_SHARE * free

    def _memory_need(self, atoms: Atoms) -> tuple[float | None, float]:
        """:meth:`memory_estimate` of ``atoms`` and the neighbours per atom it assumed
        (:func:`fastcalc.neighbors.estimate_crowding` within the cutoff)."""
        crowding = estimate_crowding(atoms.positions, atoms.cell.array, atoms.pbc, self.cutoff)
        return self.memory_estimate(len(atoms), crowding.neighbors), crowding.neighbors

    def _check_memory(self, atoms: Atoms) -> None:
        """Refuse, before the neighbour search, a system whose estimated edges need more
        memory than the device has free (see :meth:`memory_estimate`)."""
        free = free_memory(self.device)
        if free is None:
            return
        needed, neighbors = self._memory_need(atoms)
        if needed is not None and needed > free:
            raise InvalidAtomsError(
                f"refused before the neighbour search: {len(atoms)} atoms with about "
                f"{neighbors:.0f} neighbours each within {self.cutoff:g} Å need about "
                f"{needed / 2**30:.1f} GiB on {self.device}, which has {free / 2**30:.1f} GiB "
                "free; evaluate a smaller system"
            )

    def _check_structure(self, atoms: Atoms) -> bool:
        """:func:`check_structure` and the memory estimate, skipped while numbers, cell and
        pbc equal those of the last structure that passed (an MD step changes only
        positions); returns :func:`spans_volume` of the cell, kept with them."""
        key = (atoms.numbers, atoms.cell.array, atoms.pbc)
        if self._checked is not None and all(map(np.array_equal, key, self._checked[:3])):
            return self._checked[3]
        check_structure(atoms, self.supported_numbers)
        self._check_memory(atoms)
        volume = spans_volume(atoms.cell.array)
        self._checked = (*(np.array(array, copy=True) for array in key), volume)
        return volume

    def check_state(self, atoms: Atoms, tol: float = 1e-15) -> list[str]:
        """ASE's changes, plus ``"info"`` when charge or spin in ``atoms.info`` changed
        (:func:`fastcalc.changes.system_changes`)."""
        return system_changes(self.atoms, atoms, tol, self.ignored_changes)

    def calculate(
        self,
        atoms: Atoms | None = None,
        properties: Collection[str] = ("energy",),
        system_changes: list[str] = all_changes,
    ) -> None:
        """Check ``atoms``, build its :class:`System`, evaluate it and store the results."""
        super().calculate(atoms, properties, system_changes)
        atoms = self.atoms
        check_positions(atoms)
        has_volume = self._check_structure(atoms)
        if "stress" in properties and not has_volume:
            raise PropertyNotImplementedError(
                "stress is (1/V) dE/dstrain and needs a cell of three linearly independent "
                f"vectors, with a volume: cell={atoms.cell.array.tolist()}, "
                f"pbc={atoms.pbc.tolist()}; give each non-periodic axis a cell vector "
                "(the stress then counts the vacuum in the volume)"
            )
        positions = torch.tensor(atoms.positions, dtype=self.dtype, device=self.device)
        cell = torch.tensor(atoms.cell.array, dtype=self.dtype, device=self.device)
        pbc = self._on_device("pbc", atoms.pbc, torch.bool)
        numbers = self._on_device("numbers", atoms.numbers, torch.long)
        try:
            search = self.neighbors.candidates if self.takes_candidates else self.neighbors
            geometry = HostGeometry(atoms.positions, atoms.cell.array, atoms.pbc)
            edge_index, unit_shifts = search(positions, cell, pbc, host=geometry)
        except NeighborOverflowError as error:
            raise InvalidAtomsError(str(error)) from error
        replaced, shift = self._padding(atoms.cell.array)
        if replaced is not None:
            cell = replaced
        charge, spin = charge_and_spin(atoms.info, self.default_spin)
        system = System(
            positions=positions,
            cell=cell,
            pbc=pbc,
            numbers=numbers,
            host_numbers=atoms.numbers,
            system_index=self._system_index(len(atoms)),
            edge_index=edge_index,
            unit_shifts=unit_shifts,
            search=self.neighbors.searches,
            most_neighbors=self.neighbors.most_candidates,
            charge=charge,
            spin=spin,
            compute_stress=has_volume,
            padding_shift=shift,
        )
        with matmul_precision(self.precision):
            result = self.evaluate(system)
        self.results = {
            "energy": result.energy, "free_energy": result.energy, "forces": result.forces
        }
        if result.stress is not None:
            self.results["stress"] = full_3x3_to_voigt_6_stress(result.stress)
        if result.energies is not None:
            self.results["energies"] = result.energies


def atom_chunks(
    items: Iterable[T],
    size: Callable[[T], int],
    max_atoms: int,
    cost: Callable[[T], float] | None = None,
    budget: float = math.inf,
) -> Iterator[list[T]]:
    """``items`` in order, cut into runs of at most ``max_atoms`` atoms (``size`` of each)
    and, given each item's ``cost``, at most ``budget`` (a larger item goes alone). If
    reading ``items`` fails (a damaged file, Ctrl-C), the run read before is still handed
    out, then the error raised."""
    chunk: list[T] = []
    atoms, spent = 0, 0.0
    iterator = iter(items)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            break
        except BaseException:
            if chunk:
                yield chunk
            raise
        price = cost(item) if cost is not None else 0.0
        if chunk and (atoms + size(item) > max_atoms or spent + price > budget):
            yield chunk
            chunk, atoms, spent = [], 0, 0.0
        chunk.append(item)
        atoms += size(item)
        spent += price
    if chunk:
        yield chunk


def even_chunks(
    items: Sequence[T],
    size: Callable[[T], int],
    max_atoms: int,
    cost: Callable[[T], float] | None = None,
    budget: float = math.inf,
) -> list[list[T]]:
    """As many runs as :func:`atom_chunks` cuts ``items`` into, in order, with the atoms
    spread evenly over them: equal structures then make batches of (nearly) equal size,
    which pad to one shape (one CUDA graph, one graph's memory), where :func:`atom_chunks`
    leaves a short last run. :func:`atom_chunks`' own runs where an even spread would
    exceed ``max_atoms`` or ``budget``."""
    greedy = list(atom_chunks(items, size, max_atoms, cost, budget))
    if len(greedy) < 2:
        return greedy
    counts = [size(item) for item in items]
    total = sum(counts)
    runs: list[list[T]] = [[] for _ in greedy]
    before = 0
    for item, count in zip(items, counts):  # each item to the run its middle atom falls in
        runs[min(int(len(runs) * (before + count / 2) / total), len(runs) - 1)].append(item)
        before += count

    def fits(run: list[T]) -> bool:
        spent = sum(cost(item) for item in run) if cost is not None else 0.0
        return len(run) == 1 or (sum(map(size, run)) <= max_atoms and spent <= budget)

    return runs if all(run and fits(run) for run in runs) else greedy


def to_host(*tensors: torch.Tensor | None) -> list[np.ndarray | None]:
    """Float64 host copies of ``tensors`` (``None`` stays ``None``), shapes kept, made in
    one transfer: the host waits for the device once, not once per tensor, and the
    copies share no memory with graphs or buffers that a later call reuses."""
    present = [t for t in tensors if t is not None]
    # one concatenation on the device (in the tensors' common dtype), widened on the host
    flat = torch.cat([t.detach().reshape(-1) for t in present]).cpu().numpy().astype(np.float64)
    parts = iter(np.split(flat, np.cumsum([t.numel() for t in present])[:-1]))
    return [None if t is None else next(parts).reshape(t.shape) for t in tensors]


EnergyFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PaddedEdges], torch.Tensor]


class PotentialCalculator(TorchCalculator):
    """An ASE calculator around any torch energy function.

    ``energy_fn(positions, cell, numbers, edges)`` returns the total energy in eV;
    it may use :func:`fastcalc.geometry.edge_vectors` and must give zero for
    edges beyond ``cutoff`` (or drop them with ``edges.edge_mask``): the edges
    are padded to a multiple of ``bucket_size``. Forces and stress come from
    autograd.
    """

    def __init__(
        self, energy_fn: EnergyFunction, cutoff: float, *, bucket_size: int = 1024, **kwargs
    ) -> None:
        check_positive_int(bucket_size, "bucket_size")
        super().__init__(cutoff, **kwargs)
        self.energy_fn = energy_fn
        self.bucket_size = bucket_size

    def evaluate(self, system: System) -> Result:
        """``energy_fn`` and its autograd forces and stress on padded edges."""
        edges = pad_edges(
            system.edge_index, system.unit_shifts, system.cell, self.cutoff, self.bucket_size,
            system.padding_shift,
        )
        return Result.from_tensors(
            *energy_forces_stress(
                lambda x, c: self.energy_fn(x, c, system.numbers, edges),
                system.positions,
                system.cell,
                system.compute_stress,
            )
        )
