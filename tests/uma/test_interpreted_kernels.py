"""UMA's Triton kernels on the CPU, in Triton's interpreter, against the torch code of
the same operators: forward and backward of the edge pairs, the scattering to the
atoms and the gate, in float64 and float32, with orders m > 0 as blocks and as three
products' parts. The kernels run in a process of their own
(:func:`interpreted.interpret`), all in one."""

from __future__ import annotations

import pytest
import torch
import test_edge_gate
import test_edge_ops
from interpreted import interpret

from fastcalc.uma.edge_gate import edge_gate, edge_gate_backward
from fastcalc.uma.edge_ops import (
    edge_pairs,
    edge_pairs_backward,
    edge_to_nodes,
    edge_to_nodes_backward,
)

DTYPES = [torch.float64, torch.float32]
# (lmax, mmax, channels): UMA-S's layout, one whose m-major order drops components, and
# the m = 0 rows alone
LAYOUTS = [(2, 2, 128), (3, 1, 4), (2, 0, 16)]
CASES = [(layout, dtype) for layout in LAYOUTS for dtype in DTYPES]


def edge_calls(lmax: int, mmax: int, channels: int, dtype: torch.dtype) -> list[tuple]:
    """(kernel wrapper, custom operator, arguments) of the rotation operators."""
    o = test_edge_ops.operands(lmax, mmax, channels, dtype=dtype)
    blocks = test_edge_ops.blocks_of
    pairs_args = (o["x"], o["rotation"], o["radial"], o["neighbour"], o["centre"], mmax)
    pairs = [[block.cos() for block in edge_pairs(*pairs_args, three)] for three in (False, True)]
    nodes_args = (o["x"], blocks(o, o["messages"]), o["rotation"], o["envelope"], o["centre"],
                  mmax)
    return [
        ("pairs", edge_pairs, (*pairs_args, False)),
        ("pairs", edge_pairs, (*pairs_args, True)),
        ("pairs_backward", edge_pairs_backward, (pairs[0], *pairs_args, False)),
        ("pairs_backward", edge_pairs_backward, (pairs[1], *pairs_args, True)),
        ("to_nodes", edge_to_nodes, nodes_args),
        ("to_nodes_backward", edge_to_nodes_backward,
         (edge_to_nodes(*nodes_args).sin(), *nodes_args[1:])),
    ]


def gate_calls(lmax: int, mmax: int, channels: int, dtype: torch.dtype) -> list[tuple]:
    """(kernel wrapper, custom operator, arguments) of the gate, its other inputs as blocks
    and as three products' parts."""
    first, *others = test_edge_gate.operands(lmax, mmax, channels, dtype=dtype)
    parts = test_edge_gate.three_parts_of(others)
    _, *gated = edge_gate(first, others, lmax)
    grads = [g.cos() for g in edge_gate(first, others, lmax)]
    return [("gate", edge_gate, (first, others, lmax)),
            ("gate", edge_gate, (first, parts, lmax)),
            ("gate_backward", edge_gate_backward, (grads, first, gated, lmax, False)),
            ("gate_backward", edge_gate_backward, (grads, first, gated, lmax, True))]


def calls(layout: tuple, dtype: torch.dtype) -> list[tuple]:
    return edge_calls(*layout, dtype) + gate_calls(*layout, dtype)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    """Each case's kernel results, from one interpreter process."""
    folder = tmp_path_factory.mktemp("interpreted")
    requests = [(f"fastcalc.uma.edge_kernels:{name}", args)
                for case in CASES for name, _, args in calls(*case)]
    results = iter(interpret(requests, folder))
    return {case: [next(results) for _ in calls(*case)] for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}-{str(case[1])[6:]}")
def test_interpreted_kernels_match_the_torch_code(interpreted, case):
    """Every output of every kernel equals the operator's torch code (its CPU kernel), to
    round-off: float64 to 1e-12, float32 to 1e-5 relative."""
    layout, dtype = case
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    for (name, op, args), got in zip(calls(layout, dtype), interpreted[case]):
        expected = op(*args)
        expected = [expected] if torch.is_tensor(expected) else list(expected)
        got = [got] if torch.is_tensor(got) else list(got)
        assert len(got) == len(expected), name
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, **tol, msg=lambda m: f"{name}: {m}")
