"""nvalchemiops' torch neighbour list, imported without the rest of ``nvalchemiops.torch``.

The ``nvalchemiops.torch`` package's ``__init__`` imports its optimisers (FIRE2, L-BFGS)
and segment operators too, which fastcalc never calls: 0.8–1.0 s of every fresh process
on the H200 (2026-12-04), a seventh of a warm first result. Unless the process has
imported the package already, :func:`import_neighbor_list` registers it without running
its ``__init__`` and imports only ``nvalchemiops.torch.neighbors``. The first lookup of a
name the ``__init__`` defines (``from nvalchemiops.torch import fire2_step_coord``, in a
user's script) runs that ``__init__`` in the same module (a module ``__getattr__``,
PEP 562), so the package still offers everything it normally does.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable

__all__ = ["import_neighbor_list"]

_PACKAGE = "nvalchemiops.torch"


def _register_lazily() -> None:
    """Put ``nvalchemiops.torch`` in ``sys.modules`` with its ``__init__`` deferred to the
    first lookup of a name it does not have yet."""
    spec = importlib.util.find_spec(_PACKAGE)  # imports the parent, nvalchemiops
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{_PACKAGE} is not an importable package")
    package = importlib.util.module_from_spec(spec)
    lock = threading.RLock()
    state = {"initialised": False}

    def complete(name: str) -> object:
        with lock:  # other threads wait here until the package is complete
            if not state["initialised"]:
                state["initialised"] = True  # lookups from the __init__ itself: as usual
                spec.loader.exec_module(package)
                if package.__dict__.get("__getattr__") is complete:
                    del package.__getattr__
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}") from None

    package.__getattr__ = complete
    sys.modules[_PACKAGE] = package
    sys.modules["nvalchemiops"].torch = package  # as the import system sets a parent's


def import_neighbor_list() -> Callable[..., object]:
    """``nvalchemiops.torch.neighbors.neighbor_list``, without importing the rest of
    ``nvalchemiops.torch`` until something asks for it (see the module docstring)."""
    if _PACKAGE not in sys.modules:
        _register_lazily()
    return importlib.import_module(f"{_PACKAGE}.neighbors").neighbor_list
