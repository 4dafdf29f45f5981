"""The three-TF32 matrix product on a GPU: float32's accuracy against float64, where one
TF32 product is a thousand times worse, forward and backward."""

import pytest
import torch

import fastcalc.precision as precision

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

#: (M, K, N): tile multiples and not, UMA's edge-product shapes, a column.
SHAPES = [(256, 128, 128), (1000, 384, 640), (777, 100, 33), (64, 512, 1)]


def relative_error(ours: torch.Tensor, exact: torch.Tensor) -> float:
    return float((ours.double() - exact).abs().max() / exact.abs().max())


def operands(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``a`` (m, k), ``b`` (k, n) as a weight's transpose, and ``a @ b`` in float64."""
    generator = torch.Generator(device="cuda").manual_seed(m)
    a = torch.randn(m, k, device="cuda", generator=generator)
    b = torch.randn(n, k, device="cuda", generator=generator).t()
    return a, b, a.double() @ b.double()


@pytest.mark.parametrize("m, k, n", SHAPES)
def test_the_product_has_float32_accuracy(m, k, n):
    a, b, exact = operands(m, k, n)
    assert relative_error(precision._tf32x3_linear(a, b, None), exact) < 1e-6


@pytest.mark.parametrize("m, k, n", SHAPES)
def test_the_bias_is_added_in_the_product(m, k, n):
    a, b, exact = operands(m, k, n)
    bias = torch.linspace(-3.0, 3.0, n, device="cuda")
    result = precision._tf32x3_linear(a, b, bias)
    assert relative_error(result, exact + bias.double()) < 1e-6


@pytest.mark.parametrize("m, k, n", SHAPES[:3])
def test_one_tf32_product_of_the_same_operands_is_far_less_accurate(m, k, n):
    """The contrast that makes the test above mean something (a single column is left
    out: cuBLAS computes it exactly, without tensor cores)."""
    a, b, exact = operands(m, k, n)
    assert relative_error(precision._tf32_matmul(a, b), exact) > 1e-4
    bias = torch.linspace(-3.0, 3.0, n, device="cuda")
    assert relative_error(precision._tf32_linear(a, b, bias), exact + bias.double()) > 1e-4


def test_the_gradient_has_float32_accuracy():
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(1000, 384, device="cuda", generator=generator, requires_grad=True)
    b = torch.randn(640, 384, device="cuda", generator=generator).t()
    weights = torch.randn(1000, 640, device="cuda", generator=generator)
    (grad,) = torch.autograd.grad((precision._tf32x3_linear(a, b, None) * weights).sum(), a)
    exact = weights.double() @ b.double().t()
    assert relative_error(grad, exact) < 1e-6
