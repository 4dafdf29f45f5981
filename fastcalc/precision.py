"""Precision of matrix products: IEEE float32 everywhere, or TF32 in the network only.

torch's global flags (``torch.backends.cuda.matmul.allow_tf32``,
``torch.set_float32_matmul_precision``) switch *every* float32 matrix product to TF32,
including the geometric ones (cell shifts, Wigner rotations, strain), whose 10-bit
mantissa then spoils forces: UMA's forces came out wrong by up to a quarter of the
largest force. So a calculator call runs under :func:`matmul_precision`:

- ``"float32"``: IEEE float32 in every product, whatever the global flags say;
- ``"tf32"``: IEEE float32 too, except in the products of the network's own layers
  (linear maps, attention, built with :class:`Linear`, :func:`linear` and
  :func:`matmul`), which run on TF32 tensor cores on CUDA, forward and backward;
- ``"3xtf32"``: IEEE float32 too, except in the network's linear maps (:class:`Linear`,
  :func:`linear`), each of which runs as three TF32 tensor-core products
  (:mod:`fastcalc.tf32x3_kernel`), forward and backward: float32's accuracy within a few
  units of its last place, on tensor cores; batched products (:func:`matmul`: PET's
  attention) stay IEEE float32.

The choice is read when a model's function is traced, and baked into the graph as the
custom operators ``fastcalc::tf32_matmul``, ``fastcalc::tf32_linear`` and
``fastcalc::tf32x3_linear`` (the linear maps add their bias in the same product), which
CUDA graphs record like any other. TF32 exists only on CUDA: elsewhere ``"tf32"`` and
``"3xtf32"`` compute what ``"float32"`` does, and so do the uncompiled calls a calculator
answers in plain torch (:mod:`fastcalc.plain_torch`) while its compiled model loads.
"""

from __future__ import annotations

import contextvars
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .plain_torch import is_plain

__all__ = [
    "PRECISIONS", "FrozenLinear", "Linear", "batched_products", "check_precision", "global_tf32",
    "linear", "matmul", "matmul_precision", "network_precision",
]

#: ``precision`` values of fastcalc's calculators.
PRECISIONS = ("float32", "tf32", "3xtf32")

_NETWORK = contextvars.ContextVar("fastcalc_network_precision", default="float32")
_warned = False


def check_precision(precision: str, dtype: torch.dtype) -> str:
    """``precision`` checked against :data:`PRECISIONS` and ``dtype``; ``"tf32"`` warns
    once per process that it is reduced precision."""
    global _warned
    if precision not in PRECISIONS:
        choices = ", ".join(map(repr, PRECISIONS))
        raise ValueError(f"precision must be one of {choices}; got {precision!r}")
    if precision != "float32" and dtype != torch.float32:
        raise ValueError(f"precision={precision!r} applies to dtype float32, not {dtype}")
    if precision == "tf32" and not _warned:
        warnings.warn(
            "precision='tf32': the network's matrix products run in TF32 (10-bit mantissa) "
            "on CUDA; expect force errors near 1e-2 of the largest force",
            UserWarning,
            stacklevel=3,
        )
        _warned = True
    return precision


def _fp32_flags() -> tuple[str | None, str, str]:
    """torch's float32 matmul settings: the legacy one (None when it cannot be read,
    after a mix of the legacy and the new API) and the new API's CUDA and oneDNN ones."""
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:
        legacy = None
    backends = torch.backends
    return legacy, backends.cuda.matmul.fp32_precision, backends.mkldnn.matmul.fp32_precision


def _set_fp32_flags(flags: tuple[str | None, str, str]) -> None:
    legacy, cuda, mkldnn = flags
    if legacy is not None:
        torch.set_float32_matmul_precision(legacy)
    torch.backends.cuda.matmul.fp32_precision = cuda
    torch.backends.mkldnn.matmul.fp32_precision = mkldnn


@contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """Within: every float32 matrix product in IEEE float32, except, for ``"tf32"`` and
    ``"3xtf32"``, those of the network's layers; torch's global settings are restored on
    exit."""
    saved = _fp32_flags()
    torch.set_float32_matmul_precision("highest")  # sets the legacy and new API alike
    token = _NETWORK.set(precision)
    try:
        yield
    finally:
        _NETWORK.reset(token)
        _set_fp32_flags(saved)


@contextmanager
def global_tf32() -> Iterator[None]:
    """Within: torch's global switch to TF32 on, as a script turns it on for a calculator
    without a precision of its own (every float32 product, geometry included); torch's
    global settings are restored on exit. The benchmarks run metatomic's TF32 this way."""
    saved = _fp32_flags()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        _set_fp32_flags(saved)


@contextmanager
def _tf32_products() -> Iterator[None]:
    """Within: float32 products on TF32 tensor cores; the previous setting restored."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@torch.library.custom_op("fastcalc::tf32_matmul", mutates_args=())
def _tf32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` on TF32 tensor cores (same leading dimensions, no broadcasting)."""
    with _tf32_products():
        return torch.matmul(a, b)


@_tf32_matmul.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((*a.shape[:-1], b.shape[-1]))


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: object) -> None:
    a, b = inputs[:2]
    ctx.save_for_backward(a if b.requires_grad else None, b if a.requires_grad else None)


def _product_grads(
    ctx: torch.autograd.function.FunctionCtx,
    grad: torch.Tensor,
    product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of ``a @ b``'s operands (saved by :func:`_setup_context`), each
    computed by ``product`` (the same precision as the forward pass)."""
    a, b = ctx.saved_tensors
    grad_a = product(grad, b.mT) if ctx.needs_input_grad[0] else None
    grad_b = product(a.mT, grad) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


_tf32_matmul.register_autograd(
    lambda ctx, grad: _product_grads(ctx, grad, _tf32_matmul), setup_context=_setup_context
)


def _plain_linear(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``a @ b + bias`` (``bias`` optional) in torch's current precision."""
    return torch.matmul(a, b) if bias is None else torch.addmm(bias, a, b)


@torch.library.custom_op("fastcalc::tf32_linear", mutates_args=())
def _tf32_linear(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``a @ b + bias`` of matrices (``bias`` optional) on TF32 tensor cores, the bias
    added by cuBLAS in the same product."""
    with _tf32_products():
        return _plain_linear(a, b, bias)


@torch.library.custom_op("fastcalc::tf32x3_linear", mutates_args=())
def _tf32x3_linear(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``a @ b + bias`` of float32 matrices (``bias`` optional) as three TF32 products on
    CUDA, the bias added in the same kernel (:mod:`fastcalc.tf32x3_kernel`); elsewhere the
    plain product."""
    if not a.is_cuda:
        return _plain_linear(a, b, bias)
    from . import tf32x3_kernel

    return tf32x3_kernel.matmul(a, b, None if bias is None else bias.contiguous())


def _register_linear(op: torch.library.CustomOpDef) -> None:
    """Shape and derivatives of a linear-map operator ``op(a, b, bias)``, whose
    backward products are ``op`` too."""

    def fake(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return a.new_empty((a.shape[0], b.shape[1]))

    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        grad_a, grad_b = _product_grads(ctx, grad, lambda x, y: op(x, y, None))
        grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
        return grad_a, grad_b, grad_bias

    op.register_fake(fake)
    op.register_autograd(backward, setup_context=_setup_context)


_register_linear(_tf32_linear)
_register_linear(_tf32x3_linear)


def network_precision(x: torch.Tensor) -> str:
    """The network's precision for products of ``x``: ``"float32"`` off CUDA or float32,
    and within :func:`fastcalc.plain_torch.plain_torch` (its products are custom
    operators)."""
    if not (x.is_cuda and x.dtype == torch.float32) or is_plain():
        return "float32"
    return _NETWORK.get()


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for a network layer: TF32 under ``matmul_precision("tf32")`` on CUDA;
    ``a`` and ``b`` have the same leading (batch) dimensions."""
    return _tf32_matmul(a, b) if network_precision(a) == "tf32" else torch.matmul(a, b)


class _FrozenProduct(torch.autograd.Function):
    """``product(x, forward, bias)`` of a frozen map whose backward pass is
    ``product(grad, backward, None)``: ``forward`` and ``backward`` hold the weight's
    values (``backward`` is ``forward.mT``) in the layouts the precision's kernels run
    fastest (:class:`FrozenLinear`). Differentiable in ``x`` only."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        forward: torch.Tensor,
        backward: torch.Tensor,
        bias: torch.Tensor | None,
        product: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
    ) -> torch.Tensor:
        ctx.save_for_backward(backward)
        ctx.product = product
        return product(x, forward, bias)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None, None, None]:
        (backward,) = ctx.saved_tensors
        return ctx.product(grad, backward, None), None, None, None, None


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    weight_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.linear`` for a network layer: TF32 under ``matmul_precision("tf32")``, three TF32
    products under ``matmul_precision("3xtf32")``, on CUDA. Given ``weight_t``
    (``weight.t()``, contiguous) it is differentiable in ``x`` only (:class:`FrozenLinear`'s
    fixed weights) and multiplies, in float32, by ``weight_t`` forward and by ``weight``
    backward; in TF32, by transposed views of both: ``weight.t()`` forward and
    ``weight_t.t()`` backward."""
    precision = network_precision(x)
    if precision == "float32" and weight_t is None:
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    if precision == "float32":
        out = _FrozenProduct.apply(flat, weight_t, weight, bias, _plain_linear)
    elif precision == "tf32" and weight_t is not None:
        out = _FrozenProduct.apply(flat, weight.t(), weight_t.t(), bias, _tf32_linear)
    else:
        product = _tf32_linear if precision == "tf32" else _tf32x3_linear
        out = product(flat, weight.t(), bias)
    return out.view(*x.shape[:-1], out.shape[-1])


def batched_products(
    x: torch.Tensor, weight: torch.Tensor, weight_t: torch.Tensor
) -> torch.Tensor:
    """``x`` (B, R, K) times ``weight_t`` (B, K, N), batch by batch, in torch's current
    precision (IEEE float32 under :func:`matmul_precision`); the backward pass multiplies
    by ``weight`` (B, N, K), ``weight_t``'s transpose stored row-major (see
    :class:`FrozenLinear`). Differentiable in ``x`` only."""
    return _FrozenProduct.apply(x, weight_t, weight, None, _plain_linear)


class Linear(nn.Linear):
    """``nn.Linear`` of a network layer (see :func:`linear`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` times the weight, plus the bias."""
        return linear(x, self.weight, self.bias)


class FrozenLinear(nn.Module):
    """A network layer's linear map with fixed weights (buffers), stored both ways:
    ``weight`` (out, in) and its contiguous transpose ``weight_t`` (in, out).

    In float32 (:func:`linear`) the forward product reads ``weight_t`` and the backward
    one ``weight``: at 8,448 rows (108 atoms of UMA-S), cuBLAS's float32 kernels ran each
    of UMA's edge maps 7-20 % faster forward with the (in, out) copy, while the backward
    product is fastest as ``grad @ weight`` (``benchmarks/matmul_precision.py --layouts``).
    A 108-atom UMA-S call took 3.5 % less time, a 1008-atom one the same (H100, 2026-12-05,
    ``benchmarks/HISTORY.md``); the copy costs the weights' memory once more. cuBLAS's
    TF32 kernels run fastest on the weight operand read transposed, the other way round:
    in TF32 the forward product reads ``weight.t()`` and the backward one
    ``weight_t.t()`` (at 78,848 rows up to 1.9x faster backward than ``grad @ weight``;
    a TF32 UMA-S call took 6.2 % less time at 1008 atoms, 4.8 % at 108, timed through a
    probe making the same cuBLAS calls; H100, 2026-12-07). Write the weights through
    :meth:`assign` or :meth:`scale`, which keep the copy equal.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        weight = weight.detach()
        self.register_buffer("weight", weight.clone())
        self.register_buffer("weight_t", weight.t().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @torch.no_grad()
    def assign(self, weight: torch.Tensor) -> None:
        """Overwrite the weight (out, in) in place, and its copy."""
        self.weight.copy_(weight)
        self.weight_t.copy_(self.weight.t())

    @torch.no_grad()
    def scale(self, factor: float) -> None:
        """Multiply the map's output by ``factor``: weight, copy and bias alike."""
        for tensor in (self.weight, self.weight_t, self.bias):
            if tensor is not None:
                tensor.mul_(factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` times the weight, plus the bias."""
        return linear(x, self.weight, self.bias, self.weight_t)


def freeze_linears(module: nn.Module) -> nn.Module:
    """``module`` with every :class:`Linear` below it replaced, in place, by a
    :class:`FrozenLinear` of the same weights: for inference, where the weights are
    fixed and each map's products take the layouts its precision runs fastest."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is Linear:
                setattr(parent, name, FrozenLinear(child.weight, child.bias))
    return module
