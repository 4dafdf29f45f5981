"""recomputed(fn, x): the gradient of fn, keeping only x, in eager mode and in a traced
graph after common-subexpression elimination."""

from __future__ import annotations

import contextvars
import threading

import torch
from torch import nn
from torch._functorch.compile_utils import fx_graph_cse

from fastcalc.recompute import recomputed
from fastcalc.tracing import trace


def body() -> nn.Module:
    """LayerNorm, SiLU, Linear: a backward pass that needs several intermediates."""
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(6), nn.SiLU(), nn.Linear(6, 6)).double().requires_grad_(False)


def test_gradient_matches_finite_differences():
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: recomputed(body(), x), (x,))


def test_values_and_gradient_equal_plain_autograd():
    fn = body()
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(5, 6, dtype=torch.float64)
    plain = fn(x)
    (expected,) = torch.autograd.grad((plain * weights).sum(), x)
    ours = recomputed(fn, x)
    (grad,) = torch.autograd.grad((ours * weights).sum(), x)
    assert torch.equal(ours, plain)
    torch.testing.assert_close(grad, expected, rtol=1e-14, atol=1e-14)


def saved_by(compute) -> list[torch.Size]:
    """Shapes of the tensors autograd keeps for the backward pass of ``compute()``."""
    shapes = []

    def pack(tensor):
        shapes.append(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        compute()
    return shapes


def test_only_the_input_is_kept_for_the_backward_pass():
    fn = body()
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    assert len(saved_by(lambda: fn(x))) > 2  # LayerNorm's input and statistics, SiLU's input
    assert saved_by(lambda: recomputed(fn, x)) == [x.shape]


def as_compiled(graph_module: torch.fx.GraphModule) -> torch.fx.Graph:
    """The traced graph as the compiler meets it: ``detach`` nodes bypassed (as
    functionalization leaves them) and one node per weight (make_fx reads a weight again
    under a new attribute name, where dynamo sees one tensor)."""
    graph = graph_module.graph
    first: dict[int, torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.op == "get_attr":
            same = first.setdefault(id(getattr(graph_module, node.target)), node)
            if same is not node:
                node.replace_all_uses_with(same)
                graph.erase_node(node)
        elif node.op == "call_function" and node.target is torch.ops.aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    return graph


def test_the_recomputation_survives_common_subexpression_elimination():
    """Traced forward and backward, detaches dropped: after torch's CSE pass the graph
    still evaluates the LayerNorm twice (forward, then again in the backward pass)."""
    fn = body()

    def value_and_gradient(x):
        x = x.requires_grad_(True)
        y = recomputed(fn, x)
        return y, torch.autograd.grad(y.square().sum(), x)[0]

    graph = trace(value_and_gradient, [torch.randn(5, 6, dtype=torch.float64)])
    deduplicated = fx_graph_cse(as_compiled(graph))
    norms = [
        node for node in deduplicated.nodes
        if node.op == "call_function" and "layer_norm" in str(node.target)
        and "backward" not in str(node.target)
    ]
    assert len(norms) == 2


def test_backward_runs_under_module_hooks_of_torch_s_flop_counter():
    """FlopCounterMode hooks every module's inputs; the recomputation's backward pass must
    not hand those hooks a leaf tensor (autograd refuses that inside a backward pass)."""
    from torch.utils.flop_counter import FlopCounterMode

    fn = body()
    leaf = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    (expected,) = torch.autograd.grad(fn(2 * leaf).sum(), leaf)
    with FlopCounterMode(fn, display=False) as counter:
        (grad,) = torch.autograd.grad(recomputed(fn, 2 * leaf).sum(), leaf)
    torch.testing.assert_close(grad, expected, rtol=1e-14, atol=1e-14)
    assert counter.get_total_flops() > 0


def test_the_recomputation_sees_the_forward_pass_s_context_variables():
    """autograd runs CUDA tensors' backward passes on a thread of its own, where context
    variables (fastcalc's network precision) read their defaults; a backward pass in a
    new thread stands in for it here: the recomputation must see the forward's value."""
    mode = contextvars.ContextVar("mode", default="default")
    seen = []

    def fn(x):
        seen.append(mode.get())
        return x.square()

    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    token = mode.set("forward's")
    y = recomputed(fn, x).sum()
    mode.reset(token)
    grads = []
    thread = threading.Thread(target=lambda: grads.extend(torch.autograd.grad(y, x)))
    thread.start()
    thread.join()
    assert seen == ["forward's", "forward's"]
    torch.testing.assert_close(grads[0], 2 * x.detach(), rtol=1e-14, atol=1e-14)
