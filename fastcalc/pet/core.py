"""Pure-torch PET network: positions + cell + topology layout -> per-atom energies.

Per-atom energies are in model units, before the energy scale and the per-element
composition energies (both applied outside, in float64, see :mod:`fastcalc.pet.energy`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..precision import Linear
from .cutoffs import CUTOFF_FUNCTIONS, implicit_step
from .hypers import PETHypers
from .layers import Head, MessageBlock, attention_bias
from .layout import PETLayout, candidate_distances, pair_vectors


class SystemConditioning(nn.Module):
    """Per-structure embedding of total charge and spin multiplicity, added to node features."""

    def __init__(self, width: int, max_charge: int, max_spin_multiplicity: int) -> None:
        super().__init__()
        self.max_charge = max_charge
        self.max_spin_multiplicity = max_spin_multiplicity
        self.charge_table = nn.Embedding(2 * max_charge + 1, width)
        self.spin_table = nn.Embedding(max_spin_multiplicity, width)
        self.hidden = Linear(2 * width, width)
        self.gate = Linear(width, width)

    def check(self, charge: int, spin_multiplicity: int) -> None:
        """Refuse states outside the embedding tables."""
        top_charge, top_spin = self.max_charge, self.max_spin_multiplicity
        if not -top_charge <= charge <= top_charge:
            raise ValueError(
                f"charge {charge} is outside the model's [-{top_charge}, {top_charge}]"
            )
        if not 1 <= spin_multiplicity <= top_spin:
            raise ValueError(
                f"spin multiplicity {spin_multiplicity} is outside the model's [1, {top_spin}]"
            )

    def forward(
        self,
        charge: int | torch.Tensor,
        spin_multiplicity: int | torch.Tensor,
        device: torch.device,
    ) -> torch.Tensor:
        """(1, width) embedding of the state, or (B, width) of B states given as (B,)
        tensors. Python integers are checked first; integer tensors (graph inputs of a
        traced model) are taken as checked by the caller."""
        if isinstance(charge, int) and isinstance(spin_multiplicity, int):
            self.check(charge, spin_multiplicity)
        charge = torch.as_tensor(charge, device=device).reshape(-1)
        spin_multiplicity = torch.as_tensor(spin_multiplicity, device=device).reshape(-1)
        both = torch.cat(
            [self.charge_table(charge + self.max_charge), self.spin_table(spin_multiplicity - 1)],
            dim=-1,
        )
        return self.gate(nn.functional.silu(self.hidden(both)))


class PETCore(nn.Module):
    """The PET network for a single structure, or a batch of them as one layout.

    ``forward(positions, cell, layout)`` is differentiable in positions and cell;
    ``layout`` (see :func:`fastcalc.pet.layout.build_layout`) fixes who interacts with whom.
    """

    def __init__(self, hypers: PETHypers, atomic_types: Sequence[int]) -> None:
        super().__init__()
        self.hypers = hypers
        self.atomic_types = [int(z) for z in atomic_types]
        num_species = len(self.atomic_types)
        index = torch.full((max(self.atomic_types) + 1,), -1, dtype=torch.long)
        index[torch.tensor(self.atomic_types)] = torch.arange(num_species)
        self.register_buffer("species_index", index)

        h = hypers
        self.edge_type_embedding = nn.Embedding(num_species, h.d_pet)
        self.node_type_embeddings = nn.ModuleList(
            nn.Embedding(num_species, h.d_node) for _ in range(h.num_readout_layers)
        )
        self.blocks = nn.ModuleList(
            MessageBlock(h, num_species, first=k == 0) for k in range(h.num_gnn_layers)
        )
        self.feedforward = h.featurizer_type == "feedforward"
        if self.feedforward:
            self.merge_norms = nn.ModuleList(
                nn.LayerNorm(2 * h.d_pet) for _ in range(h.num_gnn_layers)
            )
            self.merge_hidden = nn.ModuleList(
                Linear(2 * h.d_pet, 2 * h.d_pet) for _ in range(h.num_gnn_layers)
            )
            self.merge_out = nn.ModuleList(
                Linear(2 * h.d_pet, h.d_pet) for _ in range(h.num_gnn_layers)
            )
        self.conditioning = (
            SystemConditioning(h.d_node, h.max_charge, h.max_spin_multiplicity)
            if h.system_conditioning
            else None
        )
        self.node_heads = nn.ModuleList(
            Head(h.d_node, h.d_head) for _ in range(h.num_readout_layers)
        )
        self.edge_heads = nn.ModuleList(
            Head(h.d_pet, h.d_head) for _ in range(h.num_readout_layers)
        )
        self.node_outputs = nn.ModuleList(
            Linear(h.d_head, 1) for _ in range(h.num_readout_layers)
        )
        self.edge_outputs = nn.ModuleList(
            Linear(h.d_head, 1) for _ in range(h.num_readout_layers)
        )
        self.cutoff_function = CUTOFF_FUNCTIONS[h.cutoff_function]

    def cutoff_factors(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        layout: PETLayout,
        distances: torch.Tensor,
    ) -> torch.Tensor:
        """Smooth weight (n, K) of every slot; zero in padding."""
        h = self.hypers
        if h.num_neighbors_adaptive is None:
            factors = self.cutoff_function(distances, h.cutoff, h.cutoff_width)
        else:
            pool = candidate_distances(positions, cell, layout.pool_neighbors, layout.pool_shifts)
            radii = implicit_step(
                layout.radii,
                pool,
                h.num_neighbors_adaptive,
                h.cutoff,
                h.cutoff_width_adaptive,
            )
            pair_cutoffs = 0.5 * (radii[:, None] + radii[layout.neighbors])
            factors = self.cutoff_function(distances, pair_cutoffs, h.cutoff_width)
        return torch.where(layout.mask, factors, 0.0)

    def forward(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        layout: PETLayout,
        charge: int | torch.Tensor = 0,
        spin_multiplicity: int | torch.Tensor = 1,
        system_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-atom energies (n,) in model units (unscaled, without composition energies).

        ``charge`` and ``spin_multiplicity`` matter only with system conditioning; see
        :meth:`SystemConditioning.forward` for integers versus tensors. For a batch,
        ``cell`` is each atom's cell (n, 3, 3) (see :mod:`fastcalc.pet.layout`), charge
        and spin are (B,) tensors, one per system, and ``system_index`` (n,) gives each
        atom's system.
        """
        n = positions.shape[0]
        centers = torch.arange(n, device=positions.device)[:, None]
        vectors = pair_vectors(positions, cell, centers, layout.neighbors, layout.shifts)
        distances = torch.sqrt((vectors * vectors).sum(dim=-1) + 1e-15)
        factors = self.cutoff_factors(positions, cell, layout, distances)
        bias = attention_bias(factors, layout.mask)
        neighbor_types = layout.species[layout.neighbors]
        flat_reverse = layout.reverse.reshape(-1)

        extra = None
        if self.conditioning is not None:
            extra = self.conditioning(charge, spin_multiplicity, positions.device)
            if system_index is not None:
                extra = extra[system_index]

        # the first layer's messages are the neighbours' type embeddings (looked up there)
        messages: torch.Tensor | nn.Embedding = self.edge_type_embedding
        node_features: list[torch.Tensor] = []
        edge_features: list[torch.Tensor] = []
        node = self.node_type_embeddings[0](layout.species)
        for k, block in enumerate(self.blocks):
            if k > 0 and not self.feedforward:
                node = self.node_type_embeddings[k](layout.species)
            node, edges = block(node, messages, neighbor_types, vectors, distances, bias)
            if extra is not None:
                node = node + extra
            reversed_edges = edges.reshape(-1, edges.shape[-1])[flat_reverse].view_as(edges)
            if k == 0:
                messages = self.edge_type_embedding(neighbor_types)
            if self.feedforward:
                both = self.merge_norms[k](torch.cat([edges, reversed_edges], dim=-1))
                messages = (
                    messages
                    + edges
                    + self.merge_out[k](nn.functional.silu(self.merge_hidden[k](both)))
                )
            else:
                node_features.append(node)
                edge_features.append(edges)
                messages = 0.5 * (messages + reversed_edges)
        if self.feedforward:
            node_features, edge_features = [node], [messages]

        energies = torch.zeros(n, dtype=positions.dtype, device=positions.device)
        for k in range(len(node_features)):
            node_part = self.node_outputs[k](self.node_heads[k](node_features[k]))[:, 0]
            edge_part = self.edge_outputs[k](self.edge_heads[k](edge_features[k]))[..., 0]
            energies = (
                energies
                + node_part
                + (torch.where(layout.mask, edge_part, 0.0) * factors).sum(dim=1)
            )
        return energies
