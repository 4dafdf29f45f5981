"""CapturedGraphs on a CUDA device: replays give what the function gives, one recorded
graph per input shape, and inputs changed in place are copied in again."""

import pytest
import torch

from fastcalc.tracing import CapturedGraphs

pytestmark = pytest.mark.cuda


def pair_terms(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x @ w).sin().sum(dim=1), torch.cos(x) * w.sum()


def assert_replays(graphs: CapturedGraphs, *inputs: torch.Tensor) -> None:
    expected = pair_terms(*inputs)
    for ours, theirs in zip(graphs(*inputs), expected, strict=True):
        torch.testing.assert_close(ours, theirs)


def test_one_graph_per_shape_reused_with_new_inputs():
    graphs = CapturedGraphs(pair_terms)
    w = torch.randn(3, 3, device="cuda")
    assert_replays(graphs, torch.randn(5, 3, device="cuda"), w)
    assert_replays(graphs, torch.randn(7, 3, device="cuda"), w)
    assert graphs.count == 2
    assert_replays(graphs, torch.randn(5, 3, device="cuda"), w)
    assert graphs.count == 2


def test_an_input_changed_in_place_is_copied_again():
    graphs = CapturedGraphs(pair_terms)
    x, w = torch.randn(5, 3, device="cuda"), torch.randn(3, 3, device="cuda")
    assert_replays(graphs, x, w)
    w.mul_(2.0)
    assert_replays(graphs, x, w)
