"""Building blocks of the UMA (eSCN-MD) network, constructed from checkpoint weights.

Node features have shape ``(atoms, (lmax+1)^2, channels)`` in degree-major
order; edge features live in the rotated edge frame, one tensor per order m
(:func:`fastcalc.uma.edge_ops.order_sizes`).  All modules hold frozen buffers, not
parameters: inference only differentiates with respect to geometry.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..plain_torch import is_plain
from ..precision import FrozenLinear, batched_products, matmul, network_precision
from .edge_gate import edge_gate, torch_edge_gate
from .so3 import coefficient_degrees

Weights = dict[str, torch.Tensor]


def frozen_linear(weights: Weights, prefix: str) -> FrozenLinear:
    """A network :class:`fastcalc.precision.FrozenLinear` of ``{prefix}weight`` and
    ``{prefix}bias`` (bias optional)."""
    return FrozenLinear(weights[f"{prefix}weight"], weights.get(f"{prefix}bias"))


def add_to_scalar(x: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Add ``value`` (broadcast over atoms) to the ``l = 0`` row without in-place ops."""
    return torch.cat((x[:, :1] + value, x[:, 1:]), dim=1)


class RMSNormSH(nn.Module):
    """Equivariant RMS norm (``rms_norm_sh``): centre l=0, one degree-balanced
    RMS over all components and channels per atom, per-degree affine scale."""

    def __init__(self, weights: Weights, prefix: str, lmax: int, eps: float = 1e-5) -> None:
        super().__init__()
        degrees = torch.tensor(coefficient_degrees(lmax))
        balance = 1.0 / ((2 * degrees + 1) * (lmax + 1)).to(torch.float64)
        self.eps = eps
        self.register_buffer("balance", balance.view(1, -1, 1))
        self.register_buffer("scale", weights[f"{prefix}affine_weight"][degrees].clone())
        self.register_buffer("bias", weights[f"{prefix}affine_bias"].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised node features ``x`` (atoms, (lmax+1)^2, channels), same shape."""
        scalar = x[:, :1]
        x = torch.cat((scalar - scalar.mean(dim=2, keepdim=True), x[:, 1:]), dim=1)
        mean_square = (x.square() * self.balance).sum(dim=1, keepdim=True).mean(dim=2, keepdim=True)
        return add_to_scalar(x * torch.rsqrt(mean_square + self.eps) * self.scale, self.bias)


class DegreeLinear(nn.Module):
    """One channel-mixing matrix per degree (fairchem's SO3_Linear); bias on l=0."""

    def __init__(self, weights: Weights, prefix: str, lmax: int) -> None:
        super().__init__()
        degrees = torch.tensor(coefficient_degrees(lmax))
        self.register_buffer("weight", weights[f"{prefix}weight"][degrees].clone())  # (L, out, in)
        self.register_buffer("bias", weights[f"{prefix}bias"].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (N, (lmax+1)^2, in) mixed per degree into (N, (lmax+1)^2, out)."""
        mixed = matmul(x.transpose(0, 1), self.weight.transpose(1, 2)).transpose(0, 1)
        return add_to_scalar(mixed, self.bias)


class Gate(nn.Module):
    """SiLU on the l=0 component of degree-major features, sigmoid gates on the others.

    The gate of the components of degree ``l`` (rows ``l^2 .. (l+1)^2 - 1``) is gate
    channel block ``l - 1``, broadcast over the degree's rows, so that no per-component
    copy of the gates is made (nor kept for the backward pass).
    """

    def __init__(self, lmax: int, channels: int) -> None:
        super().__init__()
        self.lmax = lmax
        self.channels = channels

    def forward(self, gates: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``x`` gated: SiLU on its l=0 component, ``sigmoid(gates)`` times the others."""
        gates = torch.sigmoid(gates).unflatten(1, (self.lmax, self.channels))
        gated = [x[:, l * l:(l + 1) ** 2] * gates[:, l - 1:l] for l in range(1, self.lmax + 1)]
        return torch.cat((F.silu(x[:, :1]), *gated), dim=1)


class SpectralFeedForward(nn.Module):
    """Atom-wise gated feed-forward on spherical features (``ff_type = spectral``)."""

    def __init__(self, weights: Weights, prefix: str, lmax: int, hidden: int) -> None:
        super().__init__()
        self.gate_mlp = nn.Sequential(frozen_linear(weights, f"{prefix}scalar_mlp.0."), nn.SiLU())
        self.linear_in = DegreeLinear(weights, f"{prefix}so3_linear_1.", lmax)
        self.gate = Gate(lmax, hidden)
        self.linear_out = DegreeLinear(weights, f"{prefix}so3_linear_2.", lmax)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Node features ``x`` through the feed-forward, gated by their l=0 row; same shape."""
        gates = self.gate_mlp(x[:, 0])
        return self.linear_out(self.gate(gates, self.linear_in(x)))


class MixedLinear(FrozenLinear):
    """A linear map whose weight is a mixture of expert weights, merged in place (its
    transposed copy with it, see :class:`fastcalc.precision.FrozenLinear`).

    ``experts`` has shape ``(K, out, in)`` (``K = 1`` for a plain linear).  With
    ``complex_pair`` the merged ``[W1; W2]`` is stored as the real block matrix
    ``[[W1, -W2], [W2, W1]]`` acting on ``[x_real, x_imag]`` (SO(2) order m > 0), and
    as ``parts`` ``[W1, W2, W1 + W2]`` (3, out / 2, in) for Gauss's three products: given
    ``[x_real, x_imag, x_real + x_imag]`` (3, E, in) (:func:`fastcalc.uma.edge_ops.three_parts`),
    it returns their products ``(t0, t1, t2)`` with those, and ``x_real W1^T - x_imag W2^T
    = t0 - t1``, ``x_real W2^T + x_imag W1^T = t2 - t0 - t1``: three quarters of the block
    product's arithmetic (``benchmarks/complex_products.py``).

    The experts are a plain attribute, not a buffer: moving the module to a GPU moves
    only the merged weight, and a merge copies the experts from host memory (not pinned:
    there are at most two such copies, see ``UMACore.prepare``, cheaper than pinning
    them). Like fairchem's merged model, a GPU then holds no
    expert weights (0.54 GiB for UMA-S-shaped models), and unlike it, a new composition
    is merged again without reloading the checkpoint. :meth:`keep_experts_on_device`
    trades that memory for merges without the copy.
    """

    def __init__(
        self, experts: torch.Tensor, bias: torch.Tensor | None, complex_pair: bool
    ) -> None:
        out_features, in_features = experts.shape[1:]
        shape = (out_features, 2 * in_features) if complex_pair else (out_features, in_features)
        super().__init__(experts.new_zeros(shape), bias)
        self.complex_pair = complex_pair
        if complex_pair:
            self.register_buffer("parts", experts.new_zeros(3, out_features // 2, in_features))
            self.register_buffer("parts_t", experts.new_zeros(3, in_features, out_features // 2))
        self.experts = experts.detach().cpu()  # read only, never mutated: no copy
        if experts.shape[0] == 1:
            self.merge(experts.new_ones(1))

    def __deepcopy__(self, memo: dict) -> MixedLinear:
        """A copy with a merged weight of its own; the experts, never written, are shared
        (ten copies for NEB images hold one set of host experts, not ten)."""
        memo[id(self.experts)] = self.experts
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return clone

    def keep_experts_on_device(self) -> None:
        """Keep the experts where the merged weight is, so that later merges copy nothing."""
        self.experts = self.experts.to(self.weight.device)

    @torch.no_grad()
    def merge(self, coefficients: torch.Tensor) -> None:
        """Overwrite the merged weight with ``sum_k coefficients[k] * experts[k]``,
        computed on the weight's device in its dtype."""
        experts = self.experts.to(self.weight.device, self.weight.dtype)
        merged = torch.tensordot(coefficients.to(self.weight), experts, dims=1)
        if self.complex_pair:
            w1, w2 = merged.chunk(2)
            merged = torch.cat((torch.cat((w1, -w2), dim=1), torch.cat((w2, w1), dim=1)))
        self.assign(merged)
        self._set_parts()

    @torch.no_grad()
    def _set_parts(self) -> None:
        """``parts`` and their transposed copy, of the block weight ``[[W1, -W2], [W2,
        W1]]``, in its dtype: ``W1 + W2`` rounded there, so that the three products keep
        the complex product's structure (in float64 to float64's round-off)."""
        if self.complex_pair:
            w1, w2 = self.weight[:, : self.weight.shape[1] // 2].chunk(2)
            self.parts.copy_(torch.stack((w1, w2, w1 + w2)))
            self.parts_t.copy_(self.parts.mT)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> MixedLinear:
        """``nn.Module._apply`` (``to``, ``cuda``, ``double``...), then ``parts`` made again
        in the weight's new dtype (a cast of ``W1 + W2`` would keep the old rounding)."""
        super()._apply(fn, recurse)
        self._set_parts()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., in) times the weight, plus the bias; for a complex pair given three
        parts (3, E, in / 2), their three products (3, E, out / 2)."""
        if self.complex_pair and x.dim() == 3:
            return batched_products(x, self.parts, self.parts_t)
        return super().forward(x)


def mixed_linear(weights: Weights, prefix: str, complex_pair: bool = False) -> MixedLinear:
    """Build from either MoLE keys (``weights`` (K,out,in)) or plain ``weight`` keys."""
    if f"{prefix}weights" in weights:
        experts = weights[f"{prefix}weights"]
    else:
        experts = weights[f"{prefix}weight"].unsqueeze(0)
    return MixedLinear(experts, weights.get(f"{prefix}bias"), complex_pair)


class SO2Convolution(nn.Module):
    """SO(2)-equivariant linear map of edge-frame features, block by order m.

    ``m = 0``: a real linear map of all ``l`` components (the first convolution of a
    layer also produces the gate channels, ahead of its rows).  ``m > 0``: a complex
    linear map of the ``(+m, -m)`` pair. Features come and go as one tensor per order
    (:func:`fastcalc.uma.edge_ops.order_sizes`), each the input or output of one
    matrix product. The first convolution of a layer takes inputs already scaled
    by its radial network (:func:`fastcalc.uma.edge_ops.radial_rows`).
    """

    def __init__(self, weights: Weights, prefix: str, mmax: int) -> None:
        super().__init__()
        self.m0 = mixed_linear(weights, f"{prefix}fc_m0.")
        self.orders = nn.ModuleList(
            mixed_linear(weights, f"{prefix}so2_m_conv.{m - 1}.fc.", complex_pair=True)
            for m in range(1, mmax + 1)
        )

    def mixed_layers(self) -> list[MixedLinear]:
        """Its linear maps (m = 0, then each m > 0): the ones whose experts get merged."""
        return [self.m0, *self.orders]

    def three_products(self, x: torch.Tensor) -> bool:
        """Whether its orders m > 0 take three parts for products with features like ``x``:
        in IEEE float32 (and float64), where Gauss's three products are faster than the
        block product; TF32's block product is faster than its three (H100,
        ``benchmarks/HISTORY.md``)."""
        return (
            bool(self.orders)
            and network_precision(x) == "float32"
            and all(layer.bias is None for layer in self.orders)
        )

    def forward(self, blocks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Blocks (E, rows, C_in) or (E, rows * C_in) by order -> blocks (E, width) by
        order: each order's rows of C_out channels, flattened (m = 0: after its gate
        channels, if any). An order m > 0 given in three parts (3, E, rows / 2, C_in) gives
        its three products (3, E, rows / 2 * C_out)."""
        return [
            layer(block.flatten(-2) if block.dim() > 2 else block)
            for block, layer in zip(blocks, self.mixed_layers())
        ]


class EdgeGate(nn.Module):
    """The gate of the first convolution's outputs (:func:`fastcalc.uma.edge_gate.edge_gate`):
    SiLU on the l = 0 row, ``sigmoid`` of the gate channels' block ``l - 1`` times every
    other row of degree l, of every order; within :func:`fastcalc.plain_torch.plain_torch`
    in its torch code."""

    def __init__(self, lmax: int) -> None:
        super().__init__()
        self.lmax = lmax

    def forward(self, blocks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Gated blocks by order, each (E, rows * C), of the first convolution's outputs."""
        first, *others = blocks
        gate = torch_edge_gate if is_plain() else edge_gate
        return gate(first, others, self.lmax)


class ChargeSpinEmbedding(nn.Module):
    """Embedding of the total charge or the spin multiplicity (fairchem's three kinds)."""

    def __init__(self, weights: Weights, prefix: str, kind: str, target: str) -> None:
        super().__init__()
        if kind not in ("pos_emb", "lin_emb", "rand_emb"):
            raise NotImplementedError(f"charge/spin embedding type {kind!r} is not supported")
        self.kind = kind
        self.is_spin = target == "spin"
        self.offset = 0 if self.is_spin else 100
        if kind == "pos_emb":
            self.register_buffer("frequencies", weights[f"{prefix}W"].clone())
        elif kind == "lin_emb":
            self.linear = frozen_linear(weights, f"{prefix}lin_emb.")
        else:
            self.register_buffer("table", weights[f"{prefix}rand_emb.weight"].clone())

    def forward(self, value: int) -> torch.Tensor:
        """The embedding of the integer ``value`` (total charge or spin multiplicity)."""
        if self.kind == "rand_emb":
            return self.table[value + self.offset]
        if self.kind == "lin_emb":
            # fairchem maps spin 0 ("unset") to -100 before the linear embedding
            x = -100.0 if (self.is_spin and value == 0) else float(value)
            return self.linear(self.linear.weight.new_tensor([x]))
        phase = value * self.frequencies * 2 * math.pi
        embedding = torch.cat((torch.sin(phase), torch.cos(phase)))
        return embedding * 0.0 if (self.is_spin and value == 0) else embedding
