"""UMA's edge gate: the operator against the gate's definition row by row, its backward
pass against finite differences, and its Triton kernels against the torch code on a
GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fastcalc.uma.edge_gate import edge_gate
from fastcalc.uma.edge_ops import order_sizes
from fastcalc.uma.so3 import coefficient_degrees, m_major_order

# (lmax, mmax, channels): UMA-S's layout, one whose m-major order drops components, and
# the m = 0 rows alone
LAYOUTS = [(2, 2, 5), (3, 1, 4), (2, 0, 3)]


def operands(lmax: int, mmax: int, channels: int, device: str = "cpu", dtype=torch.float64):
    """A first convolution's outputs by order: (E, lmax * C + (lmax + 1) * C) for m = 0,
    (E, rows * C) for each m > 0."""
    gen = torch.Generator().manual_seed(lmax * 10 + mmax)
    edges, widths = 7, [rows * channels for rows in order_sizes(lmax, mmax)]
    widths[0] += lmax * channels
    return [torch.randn(edges, w, generator=gen, dtype=torch.float64).to(device, dtype)
            for w in widths]


def three_parts_of(others: list[torch.Tensor]) -> list[torch.Tensor]:
    """Three products' parts (t0, t1, t2) (3, E, rows / 2 * C) whose combination
    ``[t0 - t1, t2 - t0 - t1]`` is each block of ``others``, t0 drawn at random."""
    parts = []
    for block in others:
        plus, minus = block.chunk(2, dim=1)
        t0 = torch.randn(plus.shape, generator=torch.Generator().manual_seed(3),
                         dtype=torch.float64).to(plus)
        t1 = t0 - plus
        parts.append(torch.stack((t0, t1, minus + t0 + t1)))
    return parts


def test_gate_scales_each_row_by_the_gate_of_its_degree():
    """Row i of the edge frame (component ``m_major_order[i]``, degree l): SiLU of itself
    for l = 0, else itself times sigmoid of gate channel block l - 1."""
    lmax, mmax, channels = 3, 2, 4
    first, *others = operands(lmax, mmax, channels)
    gates = first[:, : lmax * channels].view(len(first), lmax, channels).sigmoid()
    rows = torch.cat([first[:, lmax * channels:], *others], dim=1).unflatten(1, (-1, channels))
    degrees = [coefficient_degrees(lmax)[k] for k in m_major_order(lmax, mmax)]
    expected = torch.stack(
        [F.silu(rows[:, i]) if l == 0 else rows[:, i] * gates[:, l - 1]
         for i, l in enumerate(degrees)], dim=1
    )
    got = torch.cat(edge_gate(first, others, lmax), dim=1).unflatten(1, (-1, channels))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gate_gradients_match_finite_differences(layout):
    first, *others = (block.requires_grad_() for block in operands(*layout))
    assert torch.autograd.gradcheck(
        lambda first, *others: torch.cat(edge_gate(first, list(others), layout[0]), dim=1),
        (first, *others),
    )


def test_three_products_parts_gate_as_their_combination():
    """Inputs of orders m > 0 as parts (t0, t1, t2) are gated as the block
    ``[t0 - t1, t2 - t0 - t1]``."""
    lmax, mmax, channels = 3, 2, 4
    first, *others = operands(lmax, mmax, channels)
    for got, expected in zip(edge_gate(first, three_parts_of(others), lmax),
                             edge_gate(first, others, lmax)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("layout", LAYOUTS[:2])
def test_gate_of_three_parts_gradients_match_finite_differences(layout):
    first, *others = operands(*layout)
    inputs = [first.requires_grad_(), *(p.requires_grad_() for p in three_parts_of(others))]
    assert torch.autograd.gradcheck(
        lambda first, *others: torch.cat(edge_gate(first, list(others), layout[0]), dim=1),
        inputs,
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", [(2, 2, 128), (3, 1, 4), (2, 0, 128)])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("three", [False, True], ids=["blocks", "three parts"])
def test_triton_gate_matches_the_torch_code(layout, dtype, three):
    """Forward and backward on CUDA (Triton) equal the same operator on the CPU (torch),
    its inputs of orders m > 0 as blocks or as three products' parts."""
    lmax = layout[0]
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)

    def outputs(blocks):
        first, *others = (block.requires_grad_() for block in blocks)
        gated = edge_gate(first, others, lmax)
        loss = sum((g * torch.ones_like(g).cumsum(1).sin()).sum() for g in gated)
        return [*gated, *torch.autograd.grad(loss, [first, *others])]

    first, *others = operands(*layout, dtype=dtype)
    on_cpu = [first, *(three_parts_of(others) if three else others)]
    on_gpu = [block.cuda() for block in on_cpu]
    for got, expected in zip(outputs(on_gpu), outputs(on_cpu)):
        torch.testing.assert_close(got.detach().cpu(), expected.detach(), **tol)
