"""System conditioning of UMA: charge/spin/task embedding and expert routing.

Both depend only on the *system* (task, total charge, spin multiplicity and
composition), never on geometry, so they are evaluated once per system change
and their results (the system embedding and the merged expert weights) are
reused for every geometry.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import ChargeSpinEmbedding, Weights, frozen_linear


class SystemEmbedding(nn.Module):
    """``SiLU(Linear([charge_emb, spin_emb, dataset_emb]))``: one vector per system."""

    def __init__(self, weights: Weights, backbone: dict, prefix: str = "backbone.") -> None:
        super().__init__()
        kind = backbone.get("chg_spin_emb_type", "pos_emb")
        self.charge = ChargeSpinEmbedding(weights, f"{prefix}charge_embedding.", kind, "charge")
        self.spin = ChargeSpinEmbedding(weights, f"{prefix}spin_embedding.", kind, "spin")
        self.datasets = nn.ParameterDict()
        if backbone.get("use_dataset_embedding", True):
            mapping = backbone.get("dataset_mapping") or {n: n for n in backbone["dataset_list"]}
            self.mapping = dict(mapping)
            for name in mapping:
                table = weights[f"{prefix}dataset_embedding.dataset_emb_dict.{name}.weight"]
                self.datasets[name] = nn.Parameter(table[0].clone(), requires_grad=False)
        self.mix = frozen_linear(weights, f"{prefix}mix_csd.")

    def forward(self, charge: int, spin: int, dataset: str) -> torch.Tensor:
        """The system vector of the total ``charge``, ``spin`` multiplicity and ``dataset``."""
        parts = [self.charge(charge), self.spin(spin)]
        if len(self.datasets):
            if dataset not in self.mapping:
                known = sorted(self.mapping)
                raise KeyError(f"dataset {dataset!r} has no embedding; known: {known}")
            parts.append(self.datasets[self.mapping[dataset]])
        return F.silu(self.mix(torch.cat(parts)))


class ExpertRouter(nn.Module):
    """Mixing coefficients of the linear experts for one system.

    Input: ``[mean composition embedding, system embedding]`` (composition part
    optional).  UMA-S-1.2 averages the composition with an extra zero row
    (``sum / (n + 1)``), a quirk of that release reproduced here.
    """

    def __init__(
        self, weights: Weights, backbone: dict, model_id: str | None, prefix: str = "backbone."
    ) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            frozen_linear(weights, f"{prefix}routing_mlp.0."),
            nn.SiLU(),
            frozen_linear(weights, f"{prefix}routing_mlp.2."),
            nn.SiLU(),
            frozen_linear(weights, f"{prefix}routing_mlp.4."),
            nn.SiLU(),
        )
        self.composition = None
        if backbone.get("use_composition_embedding", False):
            self.composition = nn.Parameter(
                weights[f"{prefix}composition_embedding.weight"].clone(), requires_grad=False
            )
        self.zero_row_in_mean = model_id == "UMA-S-1.2"
        self.norm = backbone.get("moe_expert_coefficient_norm", "softmax")
        if self.norm not in ("softmax", "pnorm"):
            raise NotImplementedError(f"expert coefficient norm {self.norm!r} is not supported")

    def forward(
        self, species: torch.Tensor, counts: torch.Tensor, system: torch.Tensor
    ) -> torch.Tensor:
        """Expert coefficients (K,) of a system of ``counts`` atoms of each element of
        ``species`` (as ``torch.unique`` gives them) and the ``system`` embedding."""
        parts = [system]
        if self.composition is not None:
            # the mean embedding as a sum over species weighted by their fractions: equal
            # compositions at any size give bitwise equal coefficients (a per-atom sum
            # rounds differently with the atom count), so a merge is not redone for them
            atoms = int(counts.sum()) + int(self.zero_row_in_mean)
            fractions = counts.to(system) / atoms
            parts.insert(0, fractions @ self.composition[species.to(system.device)])
        logits = self.mlp(torch.cat(parts))
        if self.norm == "softmax":
            return torch.softmax(logits, dim=0) + 0.005
        # fairchem adds 2 / (systems in batch); a single system here
        shifted = logits.abs() + 2.0
        return shifted / shifted.sum()
