"""Architecture hyper-parameters of a PET model, validated against what PETCore supports."""

from __future__ import annotations

from dataclasses import dataclass

_CHOICES = {
    "cutoff_function": ("Bump", "Cosine"),
    "normalization": ("RMSNorm", "LayerNorm"),
    "activation": ("SwiGLU", "SiLU"),
    "transformer_type": ("PreLN", "PostLN"),
    "featurizer_type": ("feedforward", "residual"),
}


@dataclass(frozen=True)
class PETHypers:
    """Everything needed to rebuild the PET network and its cutoff scheme.

    Names follow metatrain's model hyper-parameters, since they are the file format.
    ``num_neighbors_adaptive=None`` means a fixed cutoff.
    """

    cutoff: float
    d_pet: int
    d_node: int
    d_head: int
    d_feedforward: int
    num_heads: int
    num_attention_layers: int
    num_gnn_layers: int
    cutoff_function: str = "Bump"
    cutoff_width: float = 0.5
    num_neighbors_adaptive: float | None = None
    adaptive_cutoff_method: str = "solver"
    cutoff_width_adaptive: float = 1.0
    normalization: str = "RMSNorm"
    activation: str = "SwiGLU"
    attention_temperature: float = 1.0
    transformer_type: str = "PreLN"
    featurizer_type: str = "feedforward"
    system_conditioning: bool = False
    max_charge: int = 10
    max_spin_multiplicity: int = 10

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"PET {name}={value!r} is unknown, expected one of {allowed}")
        if self.d_pet % self.num_heads != 0:
            raise ValueError(f"d_pet={self.d_pet} is not divisible by num_heads={self.num_heads}")
        if self.adaptive and self.adaptive_cutoff_method != "solver":
            raise NotImplementedError(
                f"PET adaptive cutoff method {self.adaptive_cutoff_method!r} is not "
                "implemented in fastcalc (only 'solver' is)"
            )

    @property
    def adaptive(self) -> bool:
        """Whether every atom gets its own cutoff chosen from its neighbour density."""
        return self.num_neighbors_adaptive is not None

    @property
    def num_readout_layers(self) -> int:
        """How many GNN layers feed the energy heads (all for residual, the last one else)."""
        return self.num_gnn_layers if self.featurizer_type == "residual" else 1


def unsupported_features(zbl: bool, long_range: bool) -> None:
    """Refuse model parts that PETCore does not compute (they would silently change energies)."""
    missing = [
        name for name, present in (("ZBL repulsion", zbl), ("long-range", long_range)) if present
    ]
    if missing:
        raise NotImplementedError(
            f"PET models with {' and '.join(missing)} parts are not supported by fastcalc"
        )
