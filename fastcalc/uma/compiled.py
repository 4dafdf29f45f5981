"""One compiled energy + gradients graph per static shape (atom count, edge bucket).

The UMA function is traced once (forward and backward in one graph, see
:mod:`fastcalc.tracing`); every new shape gets a fresh copy of that graph,
compiled with static sizes, so ``"reduce-overhead"`` records one CUDA graph per
shape, returning to a shape reuses its graph, and no shape ever recompiles
another's code. The model's tensors stay graph attributes that share storage
with the model (never copies), so merging experts in place reaches every graph;
under CUDA graphs they are marked static, so replays read them where they live.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.fx

from ..tracing import CompiledGraph, mark_static_weights, trace

Shape = tuple[int, int]


def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class ShapeCompiledGraphs:
    """Calls ``fn(positions, ..., edge_index, ...)`` through one compiled graph per shape.

    ``shape_of(inputs)`` gives the cache key; ``mode`` is ``"default"`` or
    ``"reduce-overhead"``.
    """

    def __init__(
        self,
        fn: Callable[..., tuple[torch.Tensor, ...]],
        shape_of: Callable[[Sequence[torch.Tensor]], Shape],
        mode: str,
    ) -> None:
        self.fn = fn
        self.shape_of = shape_of
        self.mode = mode
        self._traced: torch.fx.GraphModule | None = None
        self._graphs: dict[Shape, CompiledGraph] = {}
        self.recompiles = 0

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shape = self.shape_of(inputs)
        graph = self._graphs.get(shape)
        if graph is None:
            graph = self._graphs[shape] = self._compile(inputs)
            return graph(*inputs)
        before = _unique_graphs()
        outputs = graph(*inputs)
        self.recompiles += _unique_graphs() - before
        return outputs

    @property
    def stats(self) -> dict[str, int]:
        """Compiled graphs (one per shape seen) and recompilations of an existing one."""
        return {"graphs": len(self._graphs), "recompiles": self.recompiles}

    def _compile(self, inputs: Sequence[torch.Tensor]) -> CompiledGraph:
        if self._traced is None:
            self._traced = trace(lambda *args: self.fn(*args), inputs)  # plain positional
        # a new GraphModule has new code, hence its own compile cache; attributes are shared
        graph_module = torch.fx.GraphModule(self._traced, self._traced.graph)
        if self.mode == "reduce-overhead":
            mark_static_weights(graph_module)
        return CompiledGraph(graph_module, dynamic=False, mode=self.mode)

