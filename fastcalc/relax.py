"""Relaxing many structures at once: FIRE on each, all evaluated together.

:func:`relax_many` keeps a batch of structures in flight. Every step evaluates the whole
batch with one :meth:`~fastcalc.TorchCalculator.evaluate_many` call (a model that batches,
such as UMA, runs it as a few batched graphs), then moves each structure by its own FIRE
step. A structure leaves the batch when it converges, runs out of steps or cannot be
evaluated, and the next waiting one takes its place, so the batch stays full.

Each structure follows ASE's :class:`ase.optimize.FIRE` (``downhill_check=False``) step for
step: the same parameters, update order and convergence test, and, with ``cell=True``,
ASE's own :class:`~ase.filters.FrechetCellFilter` for the cell's degrees of freedom.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from ase.filters import FrechetCellFilter
from ase.utils.abc import Optimizable

from .buckets import check_positive_int
from .calculator import InvalidAtomsError, TorchCalculator, spans_volume
from .progress import progress_bar

__all__ = ["FireParameters", "FireState", "Relaxed", "irelax", "relax_many"]


@dataclass(frozen=True)
class FireParameters:
    """FIRE's settings, with ASE's defaults; ``nmin`` is ASE's ``Nmin``.

    ``dt`` the first time step, ``dtmax`` its largest value; ``maxstep`` (Å) the longest
    move of a structure in one step (the norm over all its coordinates, as in ASE);
    after ``nmin`` downhill steps in a row, each downhill step multiplies the time step by
    ``finc`` and the mixing ``a`` by ``fa``; an uphill step stops the structure, multiplies
    the time step by ``fdec`` and resets the mixing to ``astart``.
    """

    dt: float = 0.1
    maxstep: float = 0.2
    dtmax: float = 1.0
    nmin: int = 5
    finc: float = 1.1
    fdec: float = 0.5
    astart: float = 0.1
    fa: float = 0.99
    a: float = 0.1


@dataclass
class FireState:
    """The FIRE state of one structure: velocity, time step, mixing and the number of
    downhill steps since the last uphill one."""

    parameters: FireParameters
    velocity: np.ndarray | None = None
    dt: float = field(init=False)
    a: float = field(init=False)
    downhill: int = 0

    def __post_init__(self) -> None:
        self.dt = self.parameters.dt
        self.a = self.parameters.a

    def displacement(self, force: np.ndarray) -> np.ndarray:
        """The move of this step for the (flat) ``force``, the velocity updated.

        The first step starts at rest. Later ones mix the velocity towards the force while
        the power ``force . velocity`` is positive, and stop the structure otherwise; the
        velocity then takes one Euler step, and the move is cut to ``maxstep``."""
        p = self.parameters
        if self.velocity is None:
            self.velocity = np.zeros_like(force)
        elif np.vdot(force, self.velocity) > 0.0:
            speed = np.sqrt(np.vdot(self.velocity, self.velocity))
            steer = self.a * force / np.sqrt(np.vdot(force, force)) * speed
            self.velocity = (1.0 - self.a) * self.velocity + steer
            if self.downhill > p.nmin:
                self.dt = min(self.dt * p.finc, p.dtmax)
                self.a *= p.fa
            self.downhill += 1
        else:
            self.velocity = np.zeros_like(force)
            self.a = p.astart
            self.dt *= p.fdec
            self.downhill = 0
        self.velocity = self.velocity + self.dt * force
        move = self.dt * self.velocity
        length = np.sqrt(np.vdot(move, move))
        return move * (p.maxstep / length) if length > p.maxstep else move


@dataclass(frozen=True)
class Relaxed:
    """One structure's relaxation.

    ``atoms``: a copy of the input at its last geometry (positions, and the cell with
    ``cell=True``), carrying the model's results there on a
    :class:`~ase.calculators.singlepoint.SinglePointCalculator`, so that
    ``atoms.get_potential_energy()`` works and :func:`ase.io.write` records them; after an
    error, the geometry that failed, without results. ``steps``: FIRE steps taken (ASE's
    ``optimizer.nsteps``). ``converged``: whether the largest force (with ``cell=True``, the
    largest row of the filter's generalized forces) fell below ``fmax``. ``error``: the
    :class:`~fastcalc.InvalidAtomsError` that stopped it, else None.
    """

    atoms: Atoms
    steps: int
    converged: bool
    error: InvalidAtomsError | None = None

    def _result(self, name: str) -> object:
        return None if self.atoms.calc is None else self.atoms.calc.results.get(name)

    @property
    def energy(self) -> float | None:
        """Energy (eV) at the last geometry; None after an error."""
        return self._result("energy")

    @property
    def forces(self) -> np.ndarray | None:
        """Forces (N, 3) eV/Å at the last geometry, as the model gives them (constraints
        not applied); None after an error."""
        return self._result("forces")

    @property
    def stress(self) -> np.ndarray | None:
        """Stress (ASE's Voigt 6-vector, eV/Å³) at the last geometry if its cell has a
        volume; None otherwise and after an error."""
        return self._result("stress")


class _Running:
    """A structure in the batch: its Atoms, what FIRE moves (the Atoms or their cell
    filter) and its FIRE state."""

    def __init__(self, index: int, atoms: Atoms, cell: bool, fire: FireParameters) -> None:
        self.index = index
        self.atoms = atoms
        target = FrechetCellFilter(atoms) if cell else atoms
        self.optimizable: Optimizable = target.__ase_optimizable__()
        self.fire = FireState(fire)
        self.steps = 0

    def advance(self, result: dict[str, object], fmax: float, max_steps: int) -> Relaxed | None:
        """Take the evaluation ``result`` of the current geometry: the :class:`Relaxed`
        if the structure is done (converged, out of steps or failed), else None after
        moving it one FIRE step."""
        if "error" in result:
            self.atoms.calc = None  # the results held are the previous geometry's
            return Relaxed(self.atoms, self.steps, False, result["error"])
        self.atoms.calc = SinglePointCalculator(self.atoms, **result)
        gradient = self.optimizable.get_gradient()
        if self.optimizable.converged(gradient, fmax):
            return Relaxed(self.atoms, self.steps, True)
        if self.steps >= max_steps:
            return Relaxed(self.atoms, self.steps, False)
        self.optimizable.set_x(self.optimizable.get_x() + self.fire.displacement(-gradient))
        self.steps += 1
        return None


def relax_many(
    structures: Sequence[Atoms],
    calc: TorchCalculator,
    *,
    fmax: float = 0.05,
    max_steps: int = 500,
    cell: bool = False,
    max_atoms: int = 8192,
    fire: FireParameters = FireParameters(),
    progress: bool = True,
) -> list[Relaxed]:
    """Relax every structure with FIRE, all evaluated together; one :class:`Relaxed` per
    structure, in input order (the inputs are not modified).

    A structure is converged once its largest force is below ``fmax`` eV/Å (ASE's test);
    with ``cell=True`` its cell relaxes too, through ASE's
    :class:`~ase.filters.FrechetCellFilter`, and the test covers the filter's cell forces.
    It stops unconverged after ``max_steps`` steps. The batch holds structures in input
    order up to ``max_atoms`` atoms in all (at least one structure, however large), also
    the largest graph handed to ``evaluate_many``. A structure that cannot be evaluated
    (or, with ``cell=True``, has no cell volume) is returned with its error while the
    others go on. Each structure follows ASE's FIRE with parameters ``fire`` step for step,
    to rounding. A progress bar counts finished structures unless ``progress`` is False.
    """
    out: list[Relaxed | None] = [None] * len(structures)
    finished = irelax(structures, calc, fmax=fmax, max_steps=max_steps, cell=cell,
                      max_atoms=max_atoms, fire=fire)
    with progress_bar(total=len(structures), unit="structure", disable=not progress) as bar:
        for index, relaxed in finished:
            out[index] = relaxed
            bar.update(1)
    return out


def irelax(
    structures: Iterable[Atoms],
    calc: TorchCalculator,
    *,
    fmax: float = 0.05,
    max_steps: int = 500,
    cell: bool = False,
    max_atoms: int = 8192,
    fire: FireParameters = FireParameters(),
) -> Iterator[tuple[int, Relaxed]]:
    """:func:`relax_many` as a generator: ``(input index, Relaxed)`` in the order the
    relaxations finish, ``structures`` read only as places in the batch free up, so that
    a long stream can be relaxed and its results written as they come."""
    if not fmax > 0:
        raise ValueError(f"fmax must be positive, got {fmax:g} eV/A")
    if max_steps < 0:
        raise ValueError(f"max_steps must not be negative, got {max_steps}")
    check_positive_int(max_atoms, "max_atoms")
    if not hasattr(calc, "evaluate_many"):
        raise TypeError(f"relaxing in batches needs a fastcalc calculator (with "
                        f"evaluate_many), got {type(calc).__name__}")
    return _relax_in_flight(iter(enumerate(structures)), calc, fmax, max_steps, cell,
                            max_atoms, fire)


def _relax_in_flight(
    waiting: Iterator[tuple[int, Atoms]],
    calc: TorchCalculator,
    fmax: float,
    max_steps: int,
    cell: bool,
    max_atoms: int,
    fire: FireParameters,
) -> Iterator[tuple[int, Relaxed]]:
    """The loop of :func:`irelax`: fill the batch from ``waiting`` (in order, within
    ``max_atoms`` atoms; an empty batch takes the next structure whatever its size),
    evaluate it in one call, then step each structure or let it go."""
    batch: list[_Running] = []
    following = next(waiting, None)
    while following is not None or batch:
        atoms_in_batch = sum(len(running.atoms) for running in batch)
        while following is not None and (
            not batch or atoms_in_batch + len(following[1]) <= max_atoms
        ):
            index, atoms = following
            following = next(waiting, None)
            error = _cell_error(atoms) if cell else None
            if error is not None:
                yield index, Relaxed(atoms.copy(), 0, False, error)
                continue
            batch.append(_Running(index, atoms.copy(), cell, fire))
            atoms_in_batch += len(atoms)
        if not batch:  # the last ones waiting had no cell to relax
            return
        results = calc.evaluate_many([running.atoms for running in batch], max_atoms=max_atoms)
        still = []
        for running, result in zip(batch, results):
            relaxed = running.advance(result, fmax, max_steps)
            if relaxed is None:
                still.append(running)
            else:
                yield running.index, relaxed
        batch = still


def _cell_error(atoms: Atoms) -> InvalidAtomsError | None:
    """Why the cell of ``atoms`` cannot relax (it has no volume), or None."""
    cell = atoms.cell.array
    if np.isfinite(cell).all() and spans_volume(cell):
        return None
    return InvalidAtomsError(f"a cell relaxation needs three finite, linearly independent "
                             f"cell vectors: cell={cell.tolist()}")
