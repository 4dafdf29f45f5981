"""What changed in an ``Atoms`` since a calculator's last calculation.

ASE's ``Calculator.check_state`` compares the cell, pbc and each of ``Atoms.arrays`` that
ASE lists among ``all_changes`` within ``tol`` (``numpy.allclose``). That took 76 µs per
call on a 2-core CPU, a quarter of fastcalc's host work per MD step of a 64-atom cell
(2026-12-05), most of it comparing arrays that are exactly equal. :func:`system_changes`
reports the same changes, comparing each array exactly first and within ``tol`` only if
that fails.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from ase import Atoms
from ase.calculators.calculator import all_changes, equal

__all__ = ["INFO_KEYS", "system_changes"]

#: ``atoms.info`` keys that change a model's result without changing the Atoms.
INFO_KEYS = ("charge", "spin", "spin_multiplicity")


def _same(a: object, b: object, tol: float) -> bool:
    return np.array_equal(a, b) or equal(a, b, atol=tol)


def system_changes(
    old: Atoms | None, new: Atoms, tol: float, ignored: Collection[str] = ()
) -> list[str]:
    """The changes from ``old`` (None: never calculated) to ``new`` that ASE's
    ``compare_atoms(old, new, tol, ignored)`` reports, plus ``"info"`` when charge or spin
    in ``atoms.info`` changed."""
    if old is None:
        return list(all_changes)
    checked = set(all_changes) - set(ignored)
    changes = [name for name in ("cell", "pbc")
               if name in checked and not _same(getattr(old, name), getattr(new, name), tol)]
    arrays = checked - {"cell", "pbc"}
    changes += sorted(arrays & (old.arrays.keys() ^ new.arrays.keys()))
    changes += [name for name in sorted(arrays & old.arrays.keys() & new.arrays.keys())
                if not _same(old.arrays[name], new.arrays[name], tol)]
    if any(old.info.get(key) != new.info.get(key) for key in INFO_KEYS):
        changes.append("info")
    return changes
