"""nvalchemiops' torch neighbour list, imported without the rest of its packages.

Two of nvalchemiops' package ``__init__`` files import much that fastcalc never calls:
``nvalchemiops.torch`` its optimisers (FIRE2, L-BFGS) and segment operators, 0.8–1.0 s
of every fresh process on the H200 (2026-12-04), a seventh of a warm first result; and
``nvalchemiops.math``, whose one function the neighbour list's kernels import
(``wpdivmod``), its B-spline, spherical-harmonics and Gaussian-orbital kernels, 0.3 s on
a 2-core CPU. Unless the process has imported them already, :func:`import_neighbor_list`
registers both packages with their ``__init__`` deferred and imports only
``nvalchemiops.torch.neighbors``.

A deferred package still offers everything it normally does, through a module
``__getattr__`` (PEP 562): a name that its ``__init__`` binds once, by ``from MODULE
import NAME``, comes from importing that module alone; any other name (``__all__``, say)
first runs the whole ``__init__`` in the same module.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import threading
from collections import Counter
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from pathlib import Path

__all__ = ["import_neighbor_list"]

#: the packages registered with their ``__init__`` deferred
_DEFERRED = ("nvalchemiops.torch", "nvalchemiops.math")


def _reexports(spec: ModuleSpec) -> dict[str, tuple[str, str]]:
    """Names that the package ``__init__`` of ``spec`` binds once at its top level, by
    ``from MODULE import NAME [as ALIAS]``: ``{ALIAS: (MODULE, NAME)}``, MODULE absolute
    (none for a package without an ``__init__`` file to read)."""
    if spec.origin is None or not Path(spec.origin).is_file():
        return {}
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    bound: Counter[str] = Counter()
    found: dict[str, tuple[str, str]] = {}
    for statement in tree.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound[node.id] += 1
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    bound[name] += 1
                    if isinstance(node, ast.ImportFrom) and alias.name != "*":
                        module = importlib.util.resolve_name(
                            "." * node.level + (node.module or ""), spec.name
                        ) if node.level else node.module
                        found[name] = (module, alias.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound[node.name] += 1
    return {name: source for name, source in found.items() if bound[name] == 1}


def _register_lazily(name: str) -> None:
    """Put package ``name`` in ``sys.modules`` with its ``__init__`` deferred (see the
    module docstring)."""
    spec = importlib.util.find_spec(name)  # imports the parent package
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an importable package")
    package = importlib.util.module_from_spec(spec)
    sources = _reexports(spec)
    lock = threading.RLock()
    state = {"initialised": False}

    def complete(attribute: str) -> object:
        with lock:  # other threads wait here until the package has the name
            if attribute in package.__dict__:
                return package.__dict__[attribute]
            if not state["initialised"] and attribute in sources:
                module, source_name = sources[attribute]
                value = getattr(importlib.import_module(module), source_name)
                package.__dict__.setdefault(attribute, value)
                return package.__dict__[attribute]
            if not state["initialised"]:
                state["initialised"] = True  # lookups from the __init__ itself: as usual
                spec.loader.exec_module(package)
                if package.__dict__.get("__getattr__") is complete:
                    del package.__getattr__
        try:
            return package.__dict__[attribute]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}") from None

    package.__getattr__ = complete
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, package)  # as the import system sets a parent's


def import_neighbor_list() -> Callable[..., object]:
    """``nvalchemiops.torch.neighbors.neighbor_list``, without importing the rest of
    ``nvalchemiops.torch`` or ``nvalchemiops.math`` until something asks for it (see the
    module docstring)."""
    for name in _DEFERRED:
        if name not in sys.modules:
            _register_lazily(name)
    return importlib.import_module("nvalchemiops.torch.neighbors").neighbor_list
