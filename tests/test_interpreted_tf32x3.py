"""The three-TF32 product kernel on the CPU, in Triton's interpreter: every tile its
autotuner may pick computes ``a @ b (+ bias)`` for shapes that are tile multiples and
not. The interpreter multiplies in float32 whatever the input precision, so this checks
the kernel's indexing, masks and bias, not the TF32 split (Triton's own, which
``tests/test_cuda_tf32x3.py`` checks on a GPU)."""

from __future__ import annotations

import pytest
import torch
from interpreted import interpret

from fastcalc.tf32x3_kernel import CONFIGS

#: (M, K, N, bias): a tile multiple, ragged in every dimension, a column.
SHAPES = [(256, 128, 128, False), (300, 100, 33, True), (64, 200, 1, True)]
CASES = [(config, shape) for config in range(len(CONFIGS)) for shape in SHAPES]


def operands(m: int, k: int, n: int, bias: bool) -> tuple:
    """``a`` (m, k), ``b`` (k, n) as a weight's transpose, and a bias or None."""
    generator = torch.Generator().manual_seed(m + k + n)
    return (torch.randn(m, k, generator=generator), torch.randn(n, k, generator=generator).t(),
            torch.randn(n, generator=generator) if bias else None)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    """Each case's product, from one interpreter process."""
    folder = tmp_path_factory.mktemp("interpreted")
    calls = [("tf32x3_tile", (config, *operands(*shape))) for config, shape in CASES]
    return dict(zip(CASES, interpret(calls, folder)))


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"tile{case[0]}-{case[1]}")
def test_every_tile_computes_the_product(interpreted, case):
    a, b, bias = operands(*case[1])
    exact = a.double() @ b.double() + (0.0 if bias is None else bias.double())
    error = (interpreted[case].double() - exact).abs().max() / exact.abs().max()
    assert error < 1e-6
