"""UMA's complex-pair linear maps (SO(2) orders m > 0): the block product and Gauss's three
products against torch's complex matrix product."""

from __future__ import annotations

import torch

from fastcalc.uma.edge_ops import three_parts
from fastcalc.uma.layers import MixedLinear


def complex_pair(dtype: torch.dtype = torch.float64) -> tuple[MixedLinear, torch.Tensor]:
    """A complex-pair map of 3 experts (2 * 5 outputs: ``[W1; W2]``, 4 inputs), merged
    with coefficients 0.2, 0.3, 0.5, and inputs ``[x_real | x_imag]`` (6, 8)."""
    gen = torch.Generator().manual_seed(0)
    layer = MixedLinear(torch.randn(3, 10, 4, generator=gen, dtype=dtype), None, True)
    layer.merge(torch.tensor([0.2, 0.3, 0.5], dtype=dtype))
    return layer, torch.randn(6, 8, generator=gen, dtype=dtype)


def complex_product(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(W1 + i W2)(x_real + i x_imag)`` as ``[real | imaginary]``, ``weights`` ``[W1; W2]``."""
    w1, w2 = weights.chunk(2)
    product = torch.complex(*x.chunk(2, dim=1)) @ torch.complex(w1, w2).T
    return torch.cat((product.real, product.imag), dim=1)


def expected(layer: MixedLinear, x: torch.Tensor) -> torch.Tensor:
    """The complex product with the experts merged by hand."""
    coefficients = torch.tensor([0.2, 0.3, 0.5], dtype=x.dtype)
    return complex_product(x, torch.tensordot(coefficients, layer.experts.to(x), dims=1))


def combined(parts: torch.Tensor) -> torch.Tensor:
    """``[t0 - t1 | t2 - t0 - t1]`` of three products ``(t0, t1, t2)``."""
    t0, t1, t2 = parts
    return torch.cat((t0 - t1, t2 - t0 - t1), dim=1)


def test_the_block_product_is_the_complex_product():
    layer, x = complex_pair()
    torch.testing.assert_close(layer(x), expected(layer, x), rtol=1e-13, atol=1e-13)


def test_three_products_combine_to_the_complex_product():
    layer, x = complex_pair()
    parts = three_parts(x.unflatten(1, (2, 4))).flatten(2)
    torch.testing.assert_close(combined(layer(parts)), expected(layer, x), rtol=1e-13, atol=1e-13)


def test_three_products_keep_float64_round_off_after_a_cast_from_float32():
    """Merged in float32, then cast: ``W1 + W2`` is summed again in float64, so the three
    products are the complex product of the cast weights to float64's round-off."""
    layer, x = complex_pair(torch.float32)
    layer.double()
    x = x.double()
    parts = three_parts(x.unflatten(1, (2, 4))).flatten(2)
    cast = layer.experts.new_tensor([0.2, 0.3, 0.5])  # merged as float32 did, then cast
    weights = torch.tensordot(cast, layer.experts, dims=1).double()
    torch.testing.assert_close(combined(layer(parts)), complex_product(x, weights),
                               rtol=1e-13, atol=1e-13)
