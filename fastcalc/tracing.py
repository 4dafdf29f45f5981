"""One graph for energy, forces and stress: ``make_fx`` tracing, then ``torch.compile``.

A function that computes the energy and calls ``torch.autograd.grad`` inside is
traced by ``make_fx`` into a single FX graph holding the forward and the
backward pass; ``torch.compile`` then compiles that graph as a whole
(``fullgraph=True``), with symbolic sizes so that new atom or edge counts reuse it.

Traps handled here: duck shaping is kept off from tracing until after the first
compiled call, so equal sizes (say 64 atoms and 64 neighbours) do not get one
symbol and force a recompile later; profiler ``record_function`` nodes are
stripped from the graph; with symbolic sizes, inductor's coalescing analysis for
tiling (which only tunes how kernels are tiled) is off: it failed an internal
assertion on PET's graph (torch 2.11, CUDA).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.fx
import torch.fx.experimental._config as fx_config
from torch.fx.experimental.proxy_tensor import make_fx

__all__ = ["CapturedGraphs", "CompiledGraph", "mark_static_weights", "trace"]

_PROFILER_OPS = ("_record_function_enter", "_record_function_enter_new", "_record_function_exit")


def trace(fn: Callable, example_inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """``fn`` traced with symbolic sizes into one graph, profiler nodes removed.

    Tensors ``fn`` reads from elsewhere (a model's weights) become graph
    attributes that share their storage, so in-place updates reach the graph.
    """
    with fx_config.patch(use_duck_shape=False):
        graph_module = make_fx(fn, tracing_mode="symbolic", _allow_non_fake_inputs=True)(
            *example_inputs
        )
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


def mark_static_weights(graph_module: torch.fx.GraphModule) -> None:
    """Mark every tensor the graph reads as an attribute (a model's weights, buffers and
    constants) as a static address, so CUDA graph replays read it in place instead of
    copying it every call; in-place updates of those tensors still reach the graph."""
    for node in graph_module.graph.nodes:
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(graph_module)
            if isinstance(value, torch.Tensor):
                torch._dynamo.mark_static_address(value)


class CompiledGraph:
    """``torch.compile`` of a traced graph (or any function), called like it.

    ``mode`` is passed to ``torch.compile`` (``"reduce-overhead"`` records CUDA
    graphs). With ``dynamic=True`` sizes are symbolic; with ``dynamic=False`` every
    new shape compiles once, which suits bucketed shapes and CUDA graphs. Outputs
    are cloned when CUDA graphs are on, so a later replay never overwrites them.
    """

    def __init__(
        self,
        graph_module: torch.fx.GraphModule | Callable,
        *,
        dynamic: bool = True,
        mode: str | None = None,
    ) -> None:
        self.mode = mode
        # mode="reduce-overhead" is the option triton.cudagraphs; options replace the mode
        options = {"triton.cudagraphs": mode == "reduce-overhead"}
        if dynamic:
            options["triton.coalesce_tiling_analysis"] = False
        self._compiled = torch.compile(
            graph_module, dynamic=dynamic, fullgraph=True, options=options
        )
        self._first_call = True

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        if self._first_call:
            with fx_config.patch(use_duck_shape=False):
                outputs = self._compiled(*inputs)
            self._first_call = False
        else:
            outputs = self._compiled(*inputs)
        if self.mode == "reduce-overhead":
            outputs = tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in outputs)
        return outputs


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
    replay: no guards, no per-call Python of ``torch.compile``. The graphs share
    one memory pool, so they must not run concurrently, and the returned tensors
    are the graph's own buffers, overwritten by the next call of any shape:
    copy what you keep before calling again.
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        self.fn = fn
        self._pool = torch.cuda.graph_pool_handle()
        self._recordings: dict[tuple, _Recording] = {}

    @property
    def count(self) -> int:
        """CUDA graphs recorded so far (one per input shape)."""
        return len(self._recordings)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
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
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = tuple(self.fn(*static))
        return _Recording(graph, static, [(x, x._version) for x in inputs], outputs)
