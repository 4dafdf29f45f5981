"""``recompute``: the gradients of plain autograd, and a traced graph that evaluates the
recomputed function again in its backward part instead of keeping its intermediates."""

import torch

from fastcalc.recompute import recompute
from fastcalc.tracing import trace


def gathered_energy(positions: torch.Tensor, weight: torch.Tensor, index: torch.Tensor,
                    recomputed: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An energy through a per-edge gather, and its gradients in ``positions`` and ``weight``."""
    positions = positions.detach().requires_grad_(True)
    weight = weight.detach().requires_grad_(True)
    features = positions.sin() @ weight

    def edges(features: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (features[index] * weight.sum()).cos()

    per_edge = recompute(edges, features, weight) if recomputed else edges(features, weight)
    energy = per_edge.sum()
    grads = torch.autograd.grad(energy, (positions, weight))
    return energy.detach(), *grads


def test_gradients_match_plain_autograd():
    gen = torch.Generator().manual_seed(0)
    positions = torch.randn(10, 3, generator=gen, dtype=torch.float64)
    weight = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    index = torch.randint(0, 10, (40,), generator=gen)
    for ours, plain in zip(
        gathered_energy(positions, weight, index, True),
        gathered_energy(positions, weight, index, False),
    ):
        torch.testing.assert_close(ours, plain, rtol=1e-14, atol=1e-14)


def test_traced_graph_gathers_again_in_the_backward_part():
    positions, weight = torch.randn(10, 3), torch.randn(3, 4)
    index = torch.randint(0, 10, (40,))
    graph = trace(lambda p, w, i: gathered_energy(p, w, i, True), (positions, weight, index))
    gathers = [n for n in graph.graph.nodes if n.target is torch.ops.aten.index.Tensor]
    assert len(gathers) == 2  # the forward part's and the backward part's
    for ours, plain in zip(
        graph(positions, weight, index), gathered_energy(positions, weight, index, False)
    ):
        torch.testing.assert_close(ours, plain)
