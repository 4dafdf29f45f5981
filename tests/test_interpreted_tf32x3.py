"""The three-TF32 product kernel on the CPU, in Triton's interpreter: every tile its
autotuner may pick computes ``a @ b (+ bias)`` for shapes that are tile multiples and
not. The interpreter multiplies in float32 whatever the input precision, so this checks
the kernel's indexing, masks and bias, not the TF32 split (Triton's own, which
``tests/test_cuda_tf32x3.py`` checks on a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastcalc.tf32x3_kernel import CONFIGS

WORKER = Path(__file__).with_name("interpreted_kernels_worker.py")
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
    torch.save([("tf32x3_tile", (config, *operands(*shape))) for config, shape in CASES],
               folder / "calls.pt")
    done = subprocess.run([sys.executable, str(WORKER), folder / "calls.pt", folder / "out.pt"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return dict(zip(CASES, torch.load(folder / "out.pt")))


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"tile{case[0]}-{case[1]}")
def test_every_tile_computes_the_product(interpreted, case):
    a, b, bias = operands(*case[1])
    exact = a.double() @ b.double() + (0.0 if bias is None else bias.double())
    error = (interpreted[case].double() - exact).abs().max() / exact.abs().max()
    assert error < 1e-6
