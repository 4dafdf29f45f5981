"""``precision``: IEEE float32 whatever torch's global flags say, or TF32 in the network's
matrix products only (CUDA; see tests/uma/test_uma_cuda.py and tests/pet/test_pet_cuda.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ase.build import bulk

import fastcalc.precision as precision
from fastcalc import CompiledPETCalculator
from fastcalc.precision import check_precision, global_tf32, matmul_precision


def test_unknown_precision_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="'float32', 'tf32', '3xtf32'; got 'bf16'"):
        check_precision("bf16", torch.float32)


@pytest.mark.parametrize("reduced", ["tf32", "3xtf32"])
def test_tf32_products_need_float32(reduced):
    with pytest.raises(ValueError, match="dtype float32"):
        check_precision(reduced, torch.float64)


def test_tf32_warns_once_that_it_is_reduced_precision(monkeypatch):
    monkeypatch.setattr(precision, "_warned", False)
    with pytest.warns(UserWarning, match="TF32"):
        check_precision("tf32", torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_precision("tf32", torch.float32)


@pytest.fixture
def restore_flags():
    saved = precision._fp32_flags()
    yield
    precision._set_fp32_flags(saved)


@pytest.mark.usefixtures("restore_flags")
def test_calls_run_in_ieee_float32_and_leave_the_users_legacy_flag_alone():
    torch.set_float32_matmul_precision("high")  # what enables TF32 for a whole script
    with matmul_precision("float32"):
        assert torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"


@pytest.mark.usefixtures("restore_flags")
def test_calls_leave_the_users_new_api_flag_alone():
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    with matmul_precision("tf32"):
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"


def test_the_tf32_product_has_the_derivatives_of_a_matrix_product():
    """Checked in float64 on the CPU (where the flags do not apply) against finite
    differences, first and second order, plain and batched."""
    generator = torch.Generator().manual_seed(0)
    for a_shape, b_shape in [((5, 4), (4, 3)), ((2, 3, 5, 4), (2, 3, 4, 2))]:
        a = torch.randn(a_shape, dtype=torch.float64, generator=generator, requires_grad=True)
        b = torch.randn(b_shape, dtype=torch.float64, generator=generator, requires_grad=True)
        torch.testing.assert_close(precision._tf32_matmul(a, b), a @ b)
        assert torch.autograd.gradcheck(precision._tf32_matmul, (a, b))
        assert torch.autograd.gradgradcheck(precision._tf32_matmul, (a, b))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("name", ["_tf32_linear", "_tf32x3_linear"])
def test_the_linear_maps_have_the_derivatives_of_a_linear_map(name, with_bias):
    """As above, for the network's linear maps: matrices and an optional bias."""
    product = getattr(precision, name)
    generator = torch.Generator().manual_seed(1)
    a, b, bias = (
        torch.randn(shape, dtype=torch.float64, generator=generator, requires_grad=True)
        for shape in [(5, 4), (4, 3), (3,)]
    )
    operands = (a, b, bias if with_bias else None)
    torch.testing.assert_close(
        product(*operands), a @ b + bias if with_bias else a @ b
    )
    assert torch.autograd.gradcheck(product, operands)
    assert torch.autograd.gradgradcheck(product, operands)


@pytest.mark.parametrize("with_bias", [False, True])
def test_the_frozen_tf32_map_has_the_input_derivatives_of_a_linear_map(with_bias):
    """Its weights are fixed: derivatives in the input only, first and second order."""
    generator = torch.Generator().manual_seed(2)
    a = torch.randn(5, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(3, 4, dtype=torch.float64, generator=generator)
    bias = torch.randn(3, dtype=torch.float64, generator=generator) if with_bias else None
    weight_t = weight.t().contiguous()

    def frozen(x: torch.Tensor) -> torch.Tensor:
        return precision._FrozenProduct.apply(
            x, weight.t(), weight_t.t(), bias, precision._tf32_linear
        )

    torch.testing.assert_close(frozen(a), torch.nn.functional.linear(a, weight, bias))
    assert torch.autograd.gradcheck(frozen, (a,))
    assert torch.autograd.gradgradcheck(frozen, (a,))


def test_a_frozen_maps_backward_product_reads_its_backward_operand():
    """The backward product multiplies by ``b_back``, the copy the caller stores for it
    (here deliberately unequal to ``b.mT``, so that reading ``b`` would show)."""
    a = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    b, b_back = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    grad = torch.randn(5, 3, dtype=torch.float64)
    out = precision._FrozenProduct.apply(a, b, b_back, None, precision._tf32_linear)
    (ours,) = torch.autograd.grad(out, a, grad)
    torch.testing.assert_close(ours, grad @ b_back)


@pytest.mark.usefixtures("restore_flags")
def test_on_the_cpu_float32_ignores_the_global_flags_and_tf32_products_change_nothing(monkeypatch):
    atoms = bulk("Cu", cubic=True).repeat(2)
    atoms.rattle(0.05, seed=1)

    def forces(**options) -> np.ndarray:
        copy = atoms.copy()
        copy.calc = CompiledPETCalculator("pet-demo-cu", device="cpu", **options)
        return copy.get_forces()

    exact = forces()
    torch.set_float32_matmul_precision("medium")  # oneDNN may then use bfloat16
    np.testing.assert_array_equal(forces(), exact)
    monkeypatch.setattr(precision, "_warned", False)
    with pytest.warns(UserWarning, match="TF32"):
        np.testing.assert_array_equal(forces(precision="tf32"), exact)
    np.testing.assert_array_equal(forces(precision="3xtf32"), exact)


def test_global_tf32_turns_torchs_switch_on_within_and_restores_it():
    torch.set_float32_matmul_precision("highest")
    with global_tf32():
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == "highest"


def _frozen_and_reference(bias: bool) -> tuple[precision.FrozenLinear, torch.Tensor, torch.Tensor | None]:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(5, 7, dtype=torch.float64, generator=generator)
    offset = torch.randn(5, dtype=torch.float64, generator=generator) if bias else None
    return precision.FrozenLinear(weight, offset), weight, offset


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("network", ["float32", "tf32", "3xtf32"])
def test_frozen_linear_matches_torch_linear_and_its_input_gradient(monkeypatch, network, bias):
    """In every precision's products, given the operands each reads (their precision
    itself applies on CUDA only: tests/uma/test_uma_cuda.py), value and input gradient."""
    monkeypatch.setattr(precision, "network_precision", lambda x: network)
    layer, weight, offset = _frozen_and_reference(bias)
    x = torch.randn(3, 4, 7, dtype=torch.float64, requires_grad=True)
    ours = layer(x)
    (grad,) = torch.autograd.grad(ours.sin().sum(), x)
    reference = torch.nn.functional.linear(x, weight, offset)
    (expected,) = torch.autograd.grad(reference.sin().sum(), x)
    torch.testing.assert_close(ours, reference, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(grad, expected, rtol=1e-14, atol=1e-14)


def test_frozen_linear_scale_and_assign_change_both_layouts():
    layer, weight, offset = _frozen_and_reference(bias=True)
    x = torch.randn(4, 7, dtype=torch.float64)
    layer.scale(0.2)
    torch.testing.assert_close(layer(x), 0.2 * torch.nn.functional.linear(x, weight, offset))
    other = torch.randn(5, 7, dtype=torch.float64)
    layer.assign(other)
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, other, 0.2 * offset))
    assert torch.equal(layer.weight_t, other.t())


def test_freezing_a_module_keeps_its_values_and_input_gradients_and_plain_maps():
    """:func:`precision.freeze_linears` replaces the network maps below a module (nested
    too) by frozen ones and leaves torch's own ``nn.Linear`` alone."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        precision.Linear(6, 5),
        torch.nn.SiLU(),
        torch.nn.Sequential(torch.nn.Linear(5, 4), precision.Linear(4, 3, bias=False)),
    ).double()
    x = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    reference = module(x)
    (expected,) = torch.autograd.grad(reference.sin().sum(), x)
    frozen = precision.freeze_linears(module)
    ours = frozen(x)
    (grad,) = torch.autograd.grad(ours.sin().sum(), x)
    torch.testing.assert_close(ours, reference, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(grad, expected, rtol=1e-14, atol=1e-14)
    maps = (torch.nn.Linear, precision.FrozenLinear)
    kinds = [type(m) for m in frozen.modules() if isinstance(m, maps)]
    assert kinds == [precision.FrozenLinear, torch.nn.Linear, precision.FrozenLinear]


@pytest.mark.parametrize("network", ["float32", "tf32", "3xtf32"])
def test_frozen_linear_maps_an_empty_batch_to_an_empty_batch(monkeypatch, network):
    """A structure without neighbours gives maps inputs of no rows (PET's tokens)."""
    monkeypatch.setattr(precision, "network_precision", lambda x: network)
    layer, weight, offset = _frozen_and_reference(bias=True)
    x = torch.zeros(1, 0, 7, dtype=torch.float64)
    assert layer(x).shape == torch.nn.functional.linear(x, weight, offset).shape == (1, 0, 5)
