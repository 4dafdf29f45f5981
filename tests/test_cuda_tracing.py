"""CapturedGraphs on a CUDA device: replays give what the function gives, one recorded
graph per input shape, inputs changed in place are copied in again, and recordings
hold one copy of their memory, shared within a thread."""

import gc
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from fastcalc.tracing import CapturedGraphs, graph_pool

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


MIB = 2**20


def exp_rows(x: torch.Tensor) -> tuple[torch.Tensor]:
    """A function whose one large intermediate is 65536 rows of ``x`` (256 MiB for 1024
    float32 values)."""
    return (x.expand(65536, -1).exp().sum(dim=0),)


def reserved_growth(record) -> int:
    """Bytes torch's allocator reserves after ``record()`` beyond what it held before;
    run in a new thread, whose graphs get a pool of their own (nothing to reuse)."""

    def measured() -> int:
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        record()
        torch.cuda.synchronize()
        return torch.cuda.memory_reserved() - before

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(measured).result()


def test_graphs_of_two_instances_in_one_thread_share_their_memory():
    x = torch.randn(1024, device="cuda")
    expected = exp_rows(x)[0]
    kept: list[CapturedGraphs] = []

    def record(instances: int) -> None:
        kept.extend(CapturedGraphs(exp_rows) for _ in range(instances))
        for graphs in kept:
            torch.testing.assert_close(graphs(x)[0], expected)

    one = reserved_growth(lambda: record(1))
    kept.clear()
    two = reserved_growth(lambda: record(2))
    assert one >= 256 * MIB
    assert two - one < 256 * MIB  # a pool of its own would add the 256 MiB intermediate


def test_a_pool_whose_graphs_were_all_freed_is_not_shared_again():
    x = torch.randn(1024, device="cuda")

    def record_after_freeing() -> None:
        first = CapturedGraphs(exp_rows)
        first(x)
        del first
        gc.collect()
        (ours,) = CapturedGraphs(exp_rows)(x)
        torch.testing.assert_close(ours, exp_rows(x)[0])

    with ThreadPoolExecutor(1) as thread:
        thread.submit(record_after_freeing).result()


def test_graphs_recorded_in_two_threads_have_pools_of_their_own():
    device = torch.device("cuda", torch.cuda.current_device())
    graphs = CapturedGraphs(exp_rows)
    graphs(torch.randn(1024, device="cuda"))
    with ThreadPoolExecutor(1) as thread:
        assert thread.submit(graph_pool, device).result() != graph_pool(device)
