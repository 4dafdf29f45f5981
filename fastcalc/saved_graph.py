"""A traced graph compiled ahead of time into bytes, so that a later process runs it
without tracing it (make_fx) or compiling it (dynamo, inductor).

Those two steps are most of a warm start: on CPU, PET-S-shaped at 64 atoms, a process
that found inductor's code in the disk cache still spent 15 s tracing and 16 s in
dynamo's bytecode tracing of the traced graph before inductor looked its code up.

``torch.compile(...).aot_compile`` packages dynamo's output, its guards and inductor's
code into one artifact (experimental in torch). It compiles methods of a class rather
than the traced graph module itself, so the graph's Python code becomes the ``forward``
of a class, ``Traced``, in a module made from that source (kept in the
:class:`SavedGraph`). The graph's tensors are the model's own (make_fx keeps them by
reference): a saved graph names each by its attribute path in the model, and loading
attaches the tensors found at those paths, so that in-place updates of the model (UMA's
re-merged experts) reach a loaded graph as they reach a traced one.

A loaded graph does not recompile: inputs its guards refuse raise :class:`GuardsRefused`.

Dynamo is imported when a graph is compiled or loaded, not with this module, so that
``import fastcalc`` does not pay for it (about a second on the H200, more on small CPUs).
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import threading
import types
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx
import torch.fx.experimental._config as fx_config
from torch import nn

__all__ = [
    "COMPILER_MODULES", "CompilerImports", "GuardsRefused", "LoadedGraph", "SavedGraph",
    "compile_ahead", "tensor_paths",
]

#: inductor options of every fastcalc compilation (see :mod:`fastcalc.tracing`)
COMPILE_OPTIONS = {"triton.coalesce_tiling_analysis": False}
#: What loading a saved graph and its first call import: dynamo and the parts of inductor
#: that its code names (2.5 s of the first call of PET-S-shaped loaded on the H200).
COMPILER_MODULES = (
    "torch._dynamo.aot_compile", "torch._inductor.compile_fx", "torch._inductor.select_algorithm",
    "torch._inductor.codegen.memory_planning", "torch._functorch._aot_autograd.autograd_cache",
)


class GuardsRefused(RuntimeError):
    """Inputs a loaded graph was not compiled for (a loaded graph cannot recompile)."""


@dataclass(frozen=True)
class SavedGraph:
    """What a later process needs to run a compiled graph: its Python ``source``, the
    model ``attributes`` it reads (graph attribute name: path in the model) and the
    ``compiled`` artifact of torch's ``aot_compile``."""

    source: str
    attributes: dict[str, str]
    compiled: bytes


def tensor_paths(owner: nn.Module) -> dict[int, str]:
    """The attribute path in ``owner`` of each tensor it holds (parameters, buffers and
    plain tensor attributes of it and its submodules), by ``id``."""
    paths: dict[int, str] = {}
    for prefix, module in owner.named_modules():
        members = [*module._parameters.items(), *module._buffers.items(), *vars(module).items()]
        for name, value in members:
            if isinstance(value, torch.Tensor):
                paths.setdefault(id(value), f"{prefix}.{name}" if prefix else name)
    return paths


def _resolve(owner: nn.Module, path: str) -> torch.Tensor:
    module_path, _, name = path.rpartition(".")
    module = owner.get_submodule(module_path) if module_path else owner
    return getattr(module, name)


def _module(source: str) -> types.ModuleType:
    """The module of a saved graph's ``source``, made once per process and registered
    under a name of its content (torch's serialisation looks classes up by module)."""
    name = "fastcalc_graph_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    if name not in sys.modules:
        module = types.ModuleType(name)
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)
        sys.modules[name] = module
    return sys.modules[name]


def _source(graph_module: torch.fx.GraphModule) -> str:
    body = "\n".join(f"    {line}" if line else "" for line in graph_module.code.splitlines())
    return f"import torch\nfrom torch import device, inf, nan\n\n\nclass Traced(torch.nn.Module):\n{body}\n"


class CompilerImports:
    """:data:`COMPILER_MODULES` imported in a thread of their own, so that a later
    :meth:`LoadedGraph.load` finds them imported while calls meanwhile run uncompiled.

    Start it after such a call, so that the call's own imports (Triton's, for kernels
    launched eagerly) are done and cannot interleave with these. An import that fails
    here is left to the load, which imports it again and reports what fails.
    """

    def __init__(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fastcalc-compiler-imports")
        self._thread.start()

    @staticmethod
    def _run() -> None:
        for name in COMPILER_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # imported again, and reported, where a load needs it
                return

    def done(self) -> bool:
        """Whether the imports are over."""
        return not self._thread.is_alive()

    def wait(self) -> None:
        """Return once the imports are over."""
        self._thread.join()


class LoadedGraph:
    """A compiled graph bound to the model's tensors, called like the traced graph."""

    def __init__(self, compiled: object, holder: nn.Module) -> None:
        self._compiled = compiled
        self._compiled.disable_guard_check()  # checked here, to raise GuardsRefused
        self._holder = holder

    @classmethod
    def load(cls, saved: SavedGraph, owner: nn.Module | None) -> LoadedGraph:
        """``saved`` bound to the tensors of ``owner`` at its attribute paths."""
        from torch._dynamo.aot_compile import AOTCompiledFunction  # dynamo: only when needed

        module = _module(saved.source)
        compiled = AOTCompiledFunction.deserialize(saved.compiled, module.__dict__)
        return cls(compiled, _holder(module, owner, saved.attributes))

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The graph's outputs for ``inputs``; :class:`GuardsRefused` if it cannot take them."""
        if not self._compiled.guard_check(self._holder, *inputs):
            f_locals = self._compiled.prepare_f_locals(self._holder, *inputs)
            reason = self._compiled._artifacts.guard_manager.check_verbose(f_locals)
            raise GuardsRefused(f"the compiled graph's guards refuse these inputs: {reason}")
        return self._compiled(self._holder, *inputs)


def _holder(module: types.ModuleType, owner: nn.Module | None, attributes: dict[str, str]) -> nn.Module:
    holder = module.Traced()
    for name, path in attributes.items():
        # plain attributes (not registered parameters): the same tensor objects as owner's
        object.__setattr__(holder, name, _resolve(owner, path))
    return holder


def compile_ahead(
    graph_module: torch.fx.GraphModule,
    owner: nn.Module | None,
    example_inputs: Sequence[torch.Tensor],
) -> tuple[LoadedGraph, SavedGraph]:
    """``graph_module`` compiled ahead of time with dynamic shapes, ready to call, and
    saved; every tensor it reads must belong to ``owner`` (else ``ValueError``)."""
    from torch._dynamo.aot_compile import aot_compile_fullgraph
    from torch._dynamo.hooks import Hooks

    paths = tensor_paths(owner) if owner is not None else {}
    attributes: dict[str, str] = {}
    for node in graph_module.graph.nodes:
        if node.op == "get_attr":
            tensor = getattr(graph_module, node.target)
            if id(tensor) not in paths:
                raise ValueError(f"the graph's tensor {node.target} is not one of the model's")
            attributes[node.target] = paths[id(tensor)]
    source = _source(graph_module)
    module = _module(source)
    holder = _holder(module, owner, attributes)
    # compiled on tensors that own their memory: an input view would add guards on its
    # base, which a copy (CUDA graphs' static inputs) fails, and a loaded graph cannot
    # recompile
    example_inputs = [x.clone() if x._base is not None else x for x in example_inputs]
    # what torch.compile(fullgraph=True, dynamic=True, options=...).aot_compile does in
    # torch 2.13, called directly: torch 2.11 has the function but not that method
    backend = torch._TorchCompileInductorWrapper("default", COMPILE_OPTIONS, True)
    with fx_config.patch(use_duck_shape=False):
        compiled = aot_compile_fullgraph(
            module.Traced.forward, ((holder, *example_inputs), {}), hooks=Hooks(),
            backend=backend, dynamic=True,
        )
    saved = SavedGraph(source, attributes, type(compiled).serialize(compiled).serialized_data)
    return LoadedGraph(compiled, holder), saved
