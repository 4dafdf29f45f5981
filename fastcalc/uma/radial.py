"""UMA's radial networks (the edge-degree embedding's and every block's first SO(2)
convolution's), evaluated together, once per forward pass.

Each of these networks is an MLP whose first linear map reads the same edge features:
the Gaussian basis of the edge length (E, B), the source embedding of the neighbour's
element and the target embedding of the centre's element. That map is split by input:

- its embedding columns act on a per-element row, so they become per-element tables
  (``embedding @ W^T``, biases included), computed at construction and gathered by
  atomic number: integers, so nothing of them enters the backward pass;
- its basis columns, of all the networks, are stacked into one matrix: one (E, B) x
  (B, networks * hidden) product forward and one backward, instead of one
  (E, B + 2 * embedding) product per network each way.

The rest of each network (LayerNorm, SiLU, Linear, repeated) runs on its slice. Up to its
last linear map, it keeps only that slice for the backward pass and runs again there
(:func:`fastcalc.recompute.recomputed`): its (E, hidden) LayerNorm and SiLU intermediates,
three per network, would otherwise be kept from the start of the forward pass to the
end of the backward one (0.56 GiB for UMA-S-shaped models at 1008 atoms), and the
recomputation is one (E, hidden) x (hidden, hidden) product per network. The last
linear map, the widest, is not recomputed: its backward pass needs none of its inputs.
"""

from __future__ import annotations

import torch
from torch import nn

from ..precision import FrozenLinear
from ..recompute import recomputed
from .layers import Weights, frozen_linear


def radial_tail(weights: Weights, prefix: str) -> nn.Sequential:
    """The layers of fairchem's RadialMLP ``{prefix}`` after its first Linear:
    (LayerNorm, SiLU, Linear) repeated."""
    indices = sorted(
        {int(key[len(prefix):].split(".")[0]) for key in weights if key.startswith(prefix)}
    )
    layers: list[nn.Module] = []
    for index in indices[1:]:
        weight = weights[f"{prefix}{index}.weight"]
        if weight.dim() == 2:
            layers.append(frozen_linear(weights, f"{prefix}{index}."))
        else:
            norm = nn.LayerNorm(weight.shape[0], eps=1e-5)
            with torch.no_grad():
                norm.weight.copy_(weight)
                norm.bias.copy_(weights[f"{prefix}{index}.bias"])
            layers += [norm.requires_grad_(False), nn.SiLU()]
    return nn.Sequential(*layers)


class RadialNetworks(nn.Module):
    """The radial MLPs ``{prefix}0.weight, ...`` of ``prefixes``, sharing their input.

    ``weights`` holds the backbone's ``source_embedding.weight`` and
    ``target_embedding.weight`` too; the first layers' inputs are ``[basis, source,
    target]`` in that order, with ``basis_size`` Gaussians spread over ``[0, cutoff]``.
    """

    def __init__(
        self, weights: Weights, prefixes: list[str], basis_size: int, cutoff: float
    ) -> None:
        super().__init__()
        offsets = torch.linspace(0.0, cutoff, basis_size, dtype=torch.float64)
        self.register_buffer("offsets", offsets)
        self.coefficient = -0.5 / (2.0 * (offsets[1] - offsets[0]).item()) ** 2
        source = weights["source_embedding.weight"].to(torch.float64)
        target = weights["target_embedding.weight"].to(torch.float64)
        basis, sources, targets = [], [], []
        for prefix in prefixes:
            weight = weights[f"{prefix}0.weight"].to(torch.float64)
            sizes = (basis_size, source.shape[1], target.shape[1])
            if weight.shape[1] != sum(sizes):
                raise ValueError(f"{prefix}0.weight has {weight.shape[1]} inputs, not {sum(sizes)}")
            on_basis, on_source, on_target = weight.split(sizes, dim=1)
            bias = weights.get(f"{prefix}0.bias")
            basis.append(on_basis)
            sources.append(source @ on_source.T + (0.0 if bias is None else bias.to(torch.float64)))
            targets.append(target @ on_target.T)
        self.hidden_sizes = [part.shape[0] for part in basis]
        self.basis = FrozenLinear(torch.cat(basis))  # (networks * hidden, B)
        self.register_buffer("source_table", torch.cat(sources, dim=1))  # (elements, ...)
        self.register_buffer("target_table", torch.cat(targets, dim=1))
        self.tails = nn.ModuleList(radial_tail(weights, prefix) for prefix in prefixes)
        # each tail up to its last linear map (the same modules, not registered twice)
        self._bodies = [tail[:-1] for tail in self.tails]

    @torch.no_grad()
    def scale_output(self, network: int, factor: float) -> None:
        """Multiply the output of network ``network`` by ``factor``, folded into its last
        linear map once rather than applied to every call's (E, out) output."""
        last = self.tails[network][-1]
        if not isinstance(last, FrozenLinear):
            raise ValueError(f"radial network {network} does not end with a linear map")
        last.scale(factor)

    def forward(
        self, lengths: torch.Tensor, source: torch.Tensor, target: torch.Tensor
    ) -> list[torch.Tensor]:
        """Each network's output (E, out) for edges of ``lengths`` (E,) between atoms of
        atomic numbers ``source`` (E,) (the neighbour) and ``target`` (E,) (the centre)."""
        gaussians = torch.exp(self.coefficient * (lengths.unsqueeze(-1) - self.offsets) ** 2)
        hidden = (
            self.basis(gaussians)
            + self.source_table[source]
            + self.target_table[target]
        )
        parts = hidden.split(self.hidden_sizes, dim=1)
        return [
            tail[-1](recomputed(body, part))
            for tail, body, part in zip(self.tails, self._bodies, parts)
        ]
