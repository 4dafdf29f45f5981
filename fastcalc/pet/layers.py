"""Neural building blocks of PET: feed-forward nets, biased attention, token and message layers."""

from __future__ import annotations

import torch
from torch import nn

from ..precision import Linear, linear, matmul
from .hypers import PETHypers

# Cutoff weights of real neighbours are floored before their log enters attention.
_MIN_ATTENTION_WEIGHT = 1e-15


def make_norm(kind: str, width: int) -> nn.Module:
    """RMSNorm (eps = machine epsilon of the input dtype) or LayerNorm (eps = 1e-5)."""
    return nn.RMSNorm(width) if kind == "RMSNorm" else nn.LayerNorm(width)


class FeedForward(nn.Module):
    """Two linear maps around SiLU, or a SwiGLU gate (``up`` then yields value and gate halves)."""

    def __init__(self, width: int, hidden: int, activation: str) -> None:
        super().__init__()
        self.gated = activation == "SwiGLU"
        self.up = Linear(width, 2 * hidden if self.gated else hidden)
        self.down = Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., width) through the net, same shape."""
        h = self.up(x)
        if self.gated:
            value, gate = h.chunk(2, dim=-1)
            h = value * torch.sigmoid(gate)
        else:
            h = nn.functional.silu(h)
        return self.down(h)


class Head(nn.Module):
    """Linear-SiLU-Linear-SiLU map from features to last-layer features."""

    def __init__(self, width: int, d_head: int) -> None:
        super().__init__()
        self.hidden = Linear(width, d_head)
        self.out = Linear(d_head, d_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Last-layer features (..., d_head) of features ``x`` (..., width)."""
        return nn.functional.silu(self.out(nn.functional.silu(self.hidden(x))))


def attention_bias(cutoff_factors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Additive attention bias (n, 1, 1, 1 + K): log of the smooth cutoff of every key token.

    The centre token (first) has weight one. Padded slots are excluded outright (-inf):
    metatrain only floors their weight at 1e-15, which lets whatever fills the padding
    leak in when attention scores are large; excluding them makes the result independent
    of padding width and content.
    """
    centre = cutoff_factors.new_ones((cutoff_factors.shape[0], 1))
    weights = torch.cat([centre, cutoff_factors], dim=1)
    bias = torch.log(weights.clamp_min(_MIN_ATTENTION_WEIGHT))
    keep = torch.cat([mask.new_ones((mask.shape[0], 1)), mask], dim=1)
    return torch.where(keep, bias, float("-inf"))[:, None, None, :]


class TokenLayer(nn.Module):
    """One transformer layer over the tokens [centre, neighbour_1..K] of every atom.

    The centre token lives in d_node; when d_node != d_pet it is projected to d_pet for
    attention and back, followed by its own residual feed-forward. When the widths are
    equal, the centre token is replaced by its attention output.
    """

    def __init__(self, hypers: PETHypers) -> None:
        super().__init__()
        d, n_heads = hypers.d_pet, hypers.num_heads
        self.num_heads = n_heads
        self.scale = 1.0 / ((d // n_heads) ** 0.5 * hypers.attention_temperature)
        self.pre_norm = hypers.transformer_type == "PreLN"
        self.qkv = Linear(d, 3 * d)
        self.attn_out = Linear(d, d)
        self.attn_norm = make_norm(hypers.normalization, d)
        self.ffn_norm = make_norm(hypers.normalization, d)
        self.ffn = FeedForward(d, hypers.d_feedforward, hypers.activation)
        self.separate_node_width = hypers.d_node != d
        if self.separate_node_width:
            self.node_in = Linear(hypers.d_node, d)
            self.node_out = Linear(d, hypers.d_node)
            self.node_norm = make_norm(hypers.normalization, hypers.d_node)
            self.node_ffn = FeedForward(hypers.d_node, 2 * hypers.d_node, hypers.activation)

    def attend(self, tokens: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Multi-head self-attention with an additive per-key bias."""
        n, t, d = tokens.shape
        q, k, v = (
            self.qkv(tokens)
            .view(n, t, 3, self.num_heads, d // self.num_heads)
            .permute(2, 0, 3, 1, 4)
        )
        scores = matmul(q, k.transpose(-1, -2)) * self.scale + bias
        mixed = matmul(scores.softmax(dim=-1), v)
        return self.attn_out(mixed.transpose(1, 2).reshape(n, t, d))

    def forward(
        self, node: torch.Tensor, edges: torch.Tensor, bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """node (n, d_node), edges (n, K, d_pet) -> updated (node, edges)."""
        centre = self.node_in(node) if self.separate_node_width else node
        tokens = torch.cat([centre[:, None, :], edges], dim=1)
        if self.pre_norm:
            update = self.attend(self.attn_norm(tokens), bias)
            centre_out = update[:, 0]
            edges = edges + update[:, 1:]
            edges = edges + self.ffn(self.ffn_norm(edges))
        else:
            tokens = self.attn_norm(tokens + self.attend(tokens, bias))
            tokens = self.ffn_norm(tokens + self.ffn(tokens))
            centre_out, edges = tokens[:, 0], tokens[:, 1:]
        if not self.separate_node_width:
            return centre_out, edges
        node = node + self.node_out(centre_out)
        return node + self.node_ffn(self.node_norm(node)), edges


class MessageBlock(nn.Module):
    """One GNN layer: embeds edge geometry (+ neighbour type, + incoming messages) into
    tokens and runs the token layers over every atom's neighbourhood.

    The token embedding is ``mix_out(silu(mix_hidden(cat[geometry(v, r), type, messages])))``
    with the upstream weights, evaluated with ``mix_hidden`` split by input: the
    geometry map composed with its slice (4 inputs instead of d_pet), the neighbour
    types and, in the first layer, the messages (there the neighbours' type
    embeddings) as lookup tables. Same function, fewer multiplications per edge.
    """

    def __init__(self, hypers: PETHypers, num_species: int, first: bool) -> None:
        super().__init__()
        d = hypers.d_pet
        self.first = first
        self.geometry = nn.Linear(4, d)  # geometry: IEEE float32 always
        if not first:
            self.neighbor_types = nn.Embedding(num_species, d)
        self.mix_hidden = nn.Linear((2 if first else 3) * d, d)  # read in slices only
        self.mix_out = Linear(d, d)
        self.layers = nn.ModuleList(TokenLayer(hypers) for _ in range(hypers.num_attention_layers))

    def embed_edges(
        self,
        messages: torch.Tensor | nn.Embedding,
        neighbor_types: torch.Tensor,
        vectors: torch.Tensor,
        distances: torch.Tensor,
    ) -> torch.Tensor:
        """Edge tokens (n, K, d_pet); ``messages`` is (n, K, d_pet), or, for the first
        layer, the embedding whose rows of ``neighbor_types`` are the messages."""
        d = self.geometry.out_features
        weight, bias = self.mix_hidden.weight, self.mix_hidden.bias
        geometry_slice = weight[:, :d]
        hidden = nn.functional.linear(
            torch.cat([vectors, distances[..., None]], dim=-1),
            geometry_slice @ self.geometry.weight,
            geometry_slice @ self.geometry.bias + bias,
        )
        if isinstance(messages, nn.Embedding):
            table = messages.weight @ weight[:, d:].T
        else:
            table = self.neighbor_types.weight @ weight[:, d : 2 * d].T
            hidden = hidden + linear(messages, weight[:, 2 * d :])
        hidden = hidden + table[neighbor_types]
        return self.mix_out(nn.functional.silu(hidden))

    def forward(
        self,
        node: torch.Tensor,
        messages: torch.Tensor | nn.Embedding,
        neighbor_types: torch.Tensor,
        vectors: torch.Tensor,
        distances: torch.Tensor,
        bias: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """node (n, d_node), messages (see :meth:`embed_edges`) -> new (node, edge tokens)."""
        edges = self.embed_edges(messages, neighbor_types, vectors, distances)
        for layer in self.layers:
            node, edges = layer(node, edges, bias)
        return node, edges
