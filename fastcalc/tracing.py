"""One graph for energy, forces and stress: ``make_fx`` tracing, then ``torch.compile``.

A function that computes the energy and calls ``torch.autograd.grad`` inside is
traced by ``make_fx`` into a single FX graph holding the forward and the
backward pass; ``torch.compile`` then compiles that graph as a whole
with symbolic sizes so that new atom or edge counts reuse it;
:class:`CapturedGraphs` replays it from CUDA graphs recorded per padded shape.
:class:`GraphRunner` puts the three together as the runtime every model uses, and
:func:`resolve_compile_mode` gives ``compile_mode`` its one meaning.

Traps handled here: duck shaping is kept off from tracing until after the first
compiled call, so equal sizes (say 64 atoms and 64 neighbours) do not get one
symbol and force a recompile later; profiler ``record_function`` nodes are
stripped from the graph; with symbolic sizes, inductor's coalescing analysis for
tiling (which only tunes how kernels are tiled) is off: it failed an internal
assertion on PET's graph (torch 2.11, CUDA).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.fx
import torch.fx.experimental._config as fx_config
from torch.fx.experimental.proxy_tensor import make_fx

from torch import nn

from .background_build import BackgroundBuild
from .compile_cache import CacheKey, CompileCache, EntryReading, StoredEntry
from .kernel_bundle import KernelFolder, kernel_folder
from .plain_torch import plain_torch
from .progress import elapsed
from .saved_graph import (
    COMPILE_OPTIONS, CompilerImports, GuardsRefused, LoadedGraph, SavedGraph, compile_ahead,
)

__all__ = [
    "COMPILE_MODES",
    "CapturedGraphs",
    "CompiledGraph",
    "GraphRunner",
    "compiled_graphs",
    "graph_pool",
    "resolve_compile_mode",
    "trace",
]

#: ``compile_mode`` values of every fastcalc calculator (see :func:`resolve_compile_mode`).
COMPILE_MODES = ("auto", "eager", "default", "reduce-overhead")

_PROFILER_OPS = ("_record_function_enter", "_record_function_enter_new", "_record_function_exit")


def trace(
    fn: Callable, example_inputs: Sequence[torch.Tensor], *, record_stack_traces: bool = False
) -> torch.fx.GraphModule:
    """``fn`` traced with symbolic sizes into one graph, profiler nodes removed.

    Tensors ``fn`` reads from elsewhere (a model's weights) become graph
    attributes that share their storage, so in-place updates reach the graph.
    ``record_stack_traces`` keeps in ``node.meta["stack_trace"]`` the source lines
    that made each node (for reports such as ``benchmarks/graph_memory.py``).
    """
    with fx_config.patch(use_duck_shape=False):
        graph_module = make_fx(
            lambda *args: fn(*args),  # any callable: a function, bound method or object
            tracing_mode="symbolic",
            _allow_non_fake_inputs=True,
            record_stack_traces=record_stack_traces,
        )(*example_inputs)
    _strip_profiler_nodes(graph_module)
    return graph_module


def _strip_profiler_nodes(graph_module: torch.fx.GraphModule) -> None:
    graph = graph_module.graph
    profiler = [
        node
        for node in graph.nodes
        if node.op == "call_function" and getattr(node.target, "__name__", "").split(".")[0] in _PROFILER_OPS
    ]
    for node in reversed(profiler):  # an exit uses its enter: erase the exit first
        graph.erase_node(node)
    graph.lint()
    graph_module.recompile()


class CompiledGraph:
    """``torch.compile(dynamic=True)`` of a traced graph (or any function), called like
    it: sizes are symbolic, so new sizes reuse the compiled code.

    Not ``fullgraph=True``: a traced graph has no graph breaks anyway (the tests count
    compiled graphs), and on torch 2.11 ``fullgraph`` turns any error raised while the
    compiled code runs (a CUDA out-of-memory error, say) into dynamo's unrelated "Attempt
    to trace generator", since the FX module's error handler walks the traceback with a
    generator while dynamo still watches new frames.
    """

    def __init__(self, graph_module: torch.fx.GraphModule | Callable) -> None:
        self._compiled = torch.compile(graph_module, dynamic=True, options=COMPILE_OPTIONS)
        self._first_call = True

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The compiled outputs; duck shaping is off until after the first call (module doc)."""
        if self._first_call:
            with fx_config.patch(use_duck_shape=False):
                outputs = self._compiled(*inputs)
            self._first_call = False
            return outputs
        return self._compiled(*inputs)


#: The live CUDA graphs recorded per (device index, thread): any of them names the pool
#: a new recording there shares (see :func:`graph_pool`).
_LIVE_GRAPHS: dict[tuple[int, int], weakref.WeakSet] = {}


def _live_graphs(device: torch.device) -> weakref.WeakSet:
    return _LIVE_GRAPHS.setdefault((device.index, threading.get_ident()), weakref.WeakSet())


def graph_pool(device: torch.device) -> tuple[int, int]:
    """The CUDA graph memory pool for a recording on ``device`` in the calling thread: the
    pool of the graphs recorded there that are still alive, else a new one. (torch refuses
    a pool whose graphs have all been freed, so a pool is shared only while it lives.)"""
    for graph in _live_graphs(device):
        return graph.pool()
    return torch.cuda.graph_pool_handle()


@dataclass
class _Recording:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # the static buffers the graph reads
    given: list[tuple[torch.Tensor, int]]  # the tensors last copied in, and their versions
    outputs: tuple[torch.Tensor, ...]  # the buffers the graph writes


class CapturedGraphs:
    """``fn`` replayed from CUDA graphs, one recorded per input shape.

    The first call of a shape runs ``fn`` once on a side stream (where a compiled
    ``fn`` compiles and tunes), then records one call into a CUDA graph that reads
    static copies of the inputs. Later calls of that shape copy into those
    buffers only the inputs that are not the tensors given last time, unmodified
    (a neighbour layout that lasts until the next search costs nothing), and
    replay: no guards, no per-call Python of ``torch.compile``.

    Memory: every graph recorded in one thread on one device, by any instance, shares
    one memory pool while any of them lives (:func:`graph_pool`), so a process holds the
    memory of its largest graph rather than the sum of every calculator's, and gets it
    back once they are all freed. Graphs of one pool must not run concurrently, and the
    returned tensors are the graph's own buffers, overwritten by the next replay of any
    graph of that thread: copy what you
    keep before calling again (fastcalc's calculators copy to the host at once).
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        self.fn = fn
        self._recordings: dict[tuple, _Recording] = {}

    @property
    def count(self) -> int:
        """CUDA graphs recorded so far (one per input shape)."""
        return len(self._recordings)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Replay the graph recorded for these input shapes, recording it first if new."""
        key = tuple((x.shape, x.dtype, x.device) for x in inputs)
        recording = self._recordings.get(key)
        if recording is None:
            recording = self._recordings[key] = self._record(inputs)
        else:
            for i, x in enumerate(inputs):
                last, version = recording.given[i]
                if x is not last or x._version != version:
                    recording.inputs[i].copy_(x)
                    recording.given[i] = (x, x._version)
        recording.graph.replay()
        return recording.outputs

    def _record(self, inputs: Sequence[torch.Tensor]) -> _Recording:
        static = [x.clone() for x in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        device = static[0].device
        with torch.cuda.graph(graph, pool=graph_pool(device)):
            outputs = tuple(self.fn(*static))
        _live_graphs(device).add(graph)
        return _Recording(graph, static, [(x, x._version) for x in inputs], outputs)


def resolve_compile_mode(mode: str, device: torch.device) -> str:
    """The mode a calculator runs on ``device``: ``mode`` checked against
    :data:`COMPILE_MODES`, with ``"auto"`` made concrete.

    - ``"auto"`` (the default): ``"reduce-overhead"`` on CUDA, ``"eager"`` elsewhere,
      where compiling costs about a minute per model for a gain of 0–20 %;
    - ``"eager"``: the traceable function called as it is, nothing compiled;
    - ``"default"``: traced once and compiled once with dynamic shapes;
    - ``"reduce-overhead"``: compiled as ``"default"`` and replayed from CUDA graphs
      recorded per input shape; it needs CUDA, and elsewhere warns and means ``"default"``.
    """
    if mode not in COMPILE_MODES:
        choices = ", ".join(map(repr, COMPILE_MODES))
        raise ValueError(f"compile_mode must be one of {choices}; got {mode!r}")
    if mode == "auto":
        return "reduce-overhead" if device.type == "cuda" else "eager"
    if mode == "reduce-overhead" and device.type != "cuda":
        warnings.warn(
            f"compile_mode='reduce-overhead' records CUDA graphs and needs CUDA; "
            f"using 'default' on {device}",
            UserWarning,
            stacklevel=3,
        )
        return "default"
    return mode


def compiled_graphs() -> int:
    """Graphs ``torch.compile`` has compiled so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


_log = logging.getLogger("fastcalc")
#: Each kernel folder's kernels before this process's first compiled call of a stored
#: graph: an entry carries every kernel added since, so that a graph compiled after
#: another (the batched function after the single one) carries the kernels they share.
_KERNELS_BEFORE: dict[KernelFolder, set[str]] = {}


def _noted_kernel_folder(device: torch.device) -> KernelFolder:
    """The compiler's kernel folder of ``device``, its kernels noted in
    :data:`_KERNELS_BEFORE` at this process's first look."""
    kernels = kernel_folder(device)
    if kernels not in _KERNELS_BEFORE:
        _KERNELS_BEFORE[kernels] = kernels.listing()
    return kernels


class _LoadedOrCompiled:
    """A loaded graph, and for inputs its guards refuse (it cannot recompile) the function
    traced and compiled in this process at the first such call."""

    def __init__(self, loaded: LoadedGraph, fn: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        self.loaded = loaded
        self.fn = fn
        self._compiled: CompiledGraph | None = None

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._compiled is None:
            try:
                return self.loaded(*inputs)
            except GuardsRefused as refusal:
                _log.info("fastcalc: %s; compiling for them", refusal)
                self._compiled = CompiledGraph(trace(self.fn, inputs))
        return self._compiled(*inputs)


class GraphRunner:
    """The one compile-and-replay runtime of fastcalc's models.

    Calls ``fn(*tensors) -> tuple of tensors`` (a model's energy, forces and stress on
    padded inputs) in a resolved ``mode`` (see :func:`resolve_compile_mode`): eagerly,
    or traced by :func:`trace` at the first call, compiled once with dynamic shapes
    (:class:`CompiledGraph`) and, under ``"reduce-overhead"``, replayed from CUDA graphs
    recorded per padded input shape (:class:`CapturedGraphs`). A new shape then costs a
    CUDA graph recording, never a compilation. The model's tensors stay graph
    attributes sharing storage with the model, so in-place updates (re-merged experts)
    reach every graph. Outputs may be buffers that the next call overwrites: copy them
    (:func:`fastcalc.calculator.to_host`) before calling again. Gradients are enabled
    inside, since ``fn`` differentiates.

    With a ``cache`` (:class:`fastcalc.compile_cache.CompileCache`) and ``key`` (called at
    the first compilation, since a model's digest costs a pass over its weights), the
    first compiled call loads the stored graph of that key when there is one: compiled
    code, called without tracing or compiling, bound to the tensors of ``owner`` (the
    model, which must hold every tensor ``fn`` reads). When there is none, it traces,
    compiles ahead of time (:func:`fastcalc.saved_graph.compile_ahead`) and stores the
    result. A loaded graph cannot recompile: inputs it refuses are served by ``fn``
    traced and compiled in this process. The first call logs where its time went at
    INFO level (logger ``"fastcalc"``) and shows a progress line while it compiles.

    With ``background`` (and a cache), the first calls do not wait for compiled code. A
    first call that finds no stored graph has another process build the entry
    (:class:`fastcalc.background_build.BackgroundBuild`); one that finds it reads it in a
    thread after the first answer. Either way, calls run ``fn`` eagerly, within
    :func:`fastcalc.plain_torch.plain_torch` (so that they wait for neither dynamo's
    import nor Triton's kernels), until the entry is there and a thread has imported the
    compiler (:class:`fastcalc.saved_graph.CompilerImports`, 2 s or more), and the first
    call after that loads the entry. A call that runs out of GPU memory eagerly waits
    instead. If the build fails, the next call reports why in one warning and compiles in
    this process.

    A copy or an unpickled runner holds ``fn``, ``mode``, ``cache``, ``key``, ``owner``
    and ``background`` only (so ``fn`` and ``key`` must pickle: bound methods or
    module-level callables, not closures): compiled code and CUDA graphs belong to one
    process and one copy of the model's tensors, so the copy compiles anew at its first
    call (from the disk cache when there is one), and its ``stats`` start from zero.
    """

    def __init__(
        self,
        fn: Callable[..., tuple[torch.Tensor, ...]],
        mode: str,
        cache: CompileCache | None = None,
        key: Callable[[], CacheKey] | None = None,
        owner: nn.Module | None = None,
        background: bool = False,
    ) -> None:
        if mode not in COMPILE_MODES[1:]:
            raise ValueError(f"GraphRunner takes a resolved mode {COMPILE_MODES[1:]}, got {mode!r}")
        if (cache is None) != (key is None):
            raise ValueError("GraphRunner takes both cache and key, or neither")
        self.fn = fn
        self.mode = mode
        self.cache = cache
        self.key = key
        self.owner = owner
        self._background = background  # as asked: what a copy gets
        self.background = background and cache is not None
        self._run: Callable[..., tuple[torch.Tensor, ...]] | None = None
        self._compilations = 0
        self._from_cache = False
        self._key: CacheKey | None = None
        self._build: BackgroundBuild | None = None
        self._imports: CompilerImports | None = None
        self._reading: EntryReading | None = None
        self._entry: StoredEntry | None = None

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``fn(*inputs)`` with gradients on: eager, or compiled at the first call."""
        with torch.enable_grad():
            if self.mode == "eager":
                return self.fn(*inputs)
            if self._run is None:
                if self.background:
                    outputs = self._while_building(inputs)
                    if outputs is not None:
                        return outputs
                return self._first_call(inputs)
            before = compiled_graphs()
            outputs = self._run(*inputs)
            self._compilations += compiled_graphs() - before
            return outputs

    def _cache_key(self) -> CacheKey | None:
        """The disk cache key, asked of ``key`` once."""
        if self._key is None and self.key is not None:
            self._key = self.key()
        return self._key

    def _while_building(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
        """``fn(*inputs)`` eagerly while the compiled model is made ready; None once it is
        (or cannot be: ``background`` off, compile here).

        At the first call, if there is no stored graph, another process starts to build
        it. After that call's eager answer, a thread imports the compiler
        (:class:`fastcalc.saved_graph.CompilerImports`) and another then reads the stored
        graph (checking it and putting its kernels back); a graph that proves unusable is
        reported and built by another process.
        The first call after all this is done loads the graph, in the caller's thread. An
        eager call that runs out of GPU memory waits instead. A failed build is reported
        in one warning, then compiled here."""
        if self._imports is None:
            if not self._prepare(inputs):
                self.background = False
                return None
            outputs = self._eagerly(inputs)
            self._imports = CompilerImports()
            if self._build is None:  # the graph is stored: read it
                self._reading = EntryReading(partial(self._read_stored, inputs[0].device),
                                             self.cache.path(self._cache_key()))
            if outputs is not None:
                return outputs
        self._take_reading(inputs)
        if not self._ready():
            outputs = self._eagerly(inputs)
            if outputs is not None:
                return outputs
        self.wait()
        if self._reading is not None:  # read while waiting: an unusable entry is compiled here
            self._entry, self._reading = self._reading.result(), None
        build, self._build, self.background = self._build, None, False
        if build is None:
            return None
        if build.failure is not None:
            warnings.warn(f"fastcalc: compiling the model in the background failed "
                          f"({build.failure}); compiling it in this process", stacklevel=5)
        else:
            print(f"fastcalc: the model compiled in the background in "
                  f"{time.perf_counter() - build.started:.0f} s; calls run compiled from now on",
                  file=sys.stderr, flush=True)  # as its start was announced
        return None

    def _prepare(self, inputs: Sequence[torch.Tensor]) -> bool:
        """Note whether there is a stored graph (read later, in a thread), or start another
        process building it; False if neither (``fn`` cannot go to another process)."""
        key = self._cache_key()
        if self.cache.path(key).exists():
            return True
        self._build = BackgroundBuild.start(self.cache, key, self.fn, self.owner, inputs)
        return self._build is not None

    def _read_stored(self, device: torch.device) -> StoredEntry:
        """The stored graph, checked, its kernels put back: in a thread of its own, after
        the compiler's imports (finding the kernels' folder imports inductor)."""
        self._imports.wait()
        return self.cache.checked(self._cache_key(), _noted_kernel_folder(device))

    def _take_reading(self, inputs: Sequence[torch.Tensor]) -> None:
        """Once the stored graph is read, keep it; if it proved unusable (reported and
        removed), start another process building it."""
        if self._reading is None or not self._reading.done():
            return
        self._entry, self._reading = self._reading.result(), None
        if self._entry is None:
            self._build = BackgroundBuild.start(self.cache, self._cache_key(), self.fn,
                                                self.owner, inputs)

    def _ready(self) -> bool:
        """Whether the compiler is imported, the stored graph read and no build running
        (once started)."""
        return (self._imports.done() and (self._reading is None or self._reading.done())
                and (self._build is None or self._build.done()))

    def _eagerly(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
        """``fn(*inputs)`` in plain torch (:func:`fastcalc.plain_torch.plain_torch`); None if
        it runs out of GPU memory (the eager model needs more than the compiled one, which
        is then waited for)."""
        try:
            with plain_torch():
                return self.fn(*inputs)
        except torch.OutOfMemoryError:
            _log.info("fastcalc: the uncompiled model ran out of memory; waiting for the "
                      "compiled one")
            return None

    def wait(self) -> None:
        """Block until the compiled model is ready (a background build or the reading of
        the stored graph over, the compiler imported): the next call then runs compiled
        code."""
        if self._build is not None:
            self._build.wait()
        if self._reading is not None:
            self._reading.wait()
        if self._imports is not None:
            self._imports.wait()

    def _first_call(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Load the stored graph, or trace and compile, call, and store the graph with the
        kernels this process made since its first such call (:data:`_KERNELS_BEFORE`,
        :mod:`fastcalc.kernel_bundle`)."""
        start = time.perf_counter()
        key = self._cache_key()
        kernels = _noted_kernel_folder(inputs[0].device) if key is not None else None
        if self._entry is not None:  # read since the first call (see _while_building)
            loaded, self._entry = self.cache.bind(self._entry, self.owner), None
        else:
            loaded = self.cache.load(key, self.owner, kernels) if key is not None else None
        found = time.perf_counter()
        self._from_cache = loaded is not None
        saved = None
        if loaded is not None:
            run = _LoadedOrCompiled(loaded, self.fn)
            traced = found
        else:
            graph = trace(self.fn, inputs)
            traced = time.perf_counter()
            run, saved = self._compile(graph, inputs, key)
        self._run = CapturedGraphs(run) if self.mode == "reduce-overhead" else run
        before = compiled_graphs()
        compiles = isinstance(run, CompiledGraph)  # at its first call
        with elapsed(f"fastcalc: {'compiling' if compiles else 'running'} the model"):
            outputs = self._run(*inputs)
        self._compilations += compiled_graphs() - before
        if saved is not None:
            self._store(key, saved, kernels)
        _log.info(
            "fastcalc: first compiled call %.1f s: disk cache %.1f s (%s), tracing %.1f s, "
            "compiling and running %.1f s",
            time.perf_counter() - start, found - start,
            "off" if key is None else
            f"loaded {self.cache.path(key)}" if loaded is not None else "no entry",
            traced - found, time.perf_counter() - traced,
        )
        return outputs

    def _store(self, key: CacheKey, saved: SavedGraph, kernels: KernelFolder) -> None:
        """Store ``saved`` with the kernels this process made (:data:`_KERNELS_BEFORE`); a
        failure (of torch's experimental artifacts, say) is reported in one warning, since
        the model has run and runs on regardless."""
        try:
            self.cache.store(key, saved, kernels.pack(_KERNELS_BEFORE[kernels]))
        except Exception as error:
            warnings.warn(
                f"fastcalc: the compiled model cannot be stored ({error!r}); it runs "
                "regardless, and the next process compiles it again",
                stacklevel=5,
            )

    def _compile(
        self, graph: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], key: CacheKey | None
    ) -> tuple[Callable[..., tuple[torch.Tensor, ...]], SavedGraph | None]:
        """``graph`` compiled with dynamic shapes; with a cache key, ahead of time, with what
        to store (or, where that fails, reported in one warning and compiled as without a
        cache)."""
        if key is None:
            return CompiledGraph(graph), None
        try:
            with elapsed("fastcalc: compiling the model (stored for later processes)"):
                before = compiled_graphs()
                loaded, saved = compile_ahead(graph, self.owner, inputs)
                self._compilations += compiled_graphs() - before
        except Exception as error:  # torch's aot_compile is experimental: never fatal here
            warnings.warn(
                f"fastcalc: the model cannot be compiled ahead of time and stored ({error}); "
                "compiling it for this process only",
                stacklevel=4,
            )
            return CompiledGraph(graph), None
        return _LoadedOrCompiled(loaded, self.fn), saved

    def __getstate__(self) -> dict:
        return {
            "fn": self.fn, "mode": self.mode, "cache": self.cache, "key": self.key,
            "owner": self.owner, "background": self._background,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def stats(self) -> dict[str, int]:
        """``compilations`` (torch.compile graphs made; 1 after the first compiled call),
        ``cuda_graphs`` (recorded, one per padded shape), ``recompiles`` (compilations
        after the first, which should stay 0), ``from_cache`` (1 when the compiled
        graph was loaded from the disk cache: nothing traced or compiled for it) and
        ``building`` (1 while calls run uncompiled because the compiled graph is being
        built by another process or loaded, see ``background``)."""
        return {
            "compilations": self._compilations,
            "cuda_graphs": getattr(self._run, "count", 0),
            "recompiles": max(self._compilations - 1, 0),
            "from_cache": int(self._from_cache),
            "building": int(self.background and self._imports is not None and not self._ready()),
        }
