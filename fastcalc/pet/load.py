"""Load PET models from metatomic exports (``.pt``) and metatrain checkpoints (``.ckpt``).

Both formats are opened with their own libraries; we then read the hyper-parameters,
the network weights (renamed to :class:`PETCore`'s layout, LoRA adapters folded in),
the per-element composition energies and the energy scale.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..archives import archive_members, pickle_strings
from .core import PETCore
from .energy import EnergyReference
from .hypers import PETHypers, unsupported_features

_HYPER_ATTRIBUTES = (
    "cutoff",
    "d_pet",
    "d_node",
    "d_head",
    "d_feedforward",
    "num_heads",
    "num_attention_layers",
    "num_gnn_layers",
    "cutoff_function",
    "cutoff_width",
    "num_neighbors_adaptive",
    "adaptive_cutoff_method",
    "normalization",
    "activation",
    "attention_temperature",
    "transformer_type",
    "featurizer_type",
)

# metatrain backend state-dict names -> PETCore names (after the per-target part is removed)
_RENAMES = [
    (r"^species_to_species_index$", "species_index"),
    (r"^edge_embedder\.", "edge_type_embedding."),
    (r"^node_embedders\.(\d+)\.", r"node_type_embeddings.\1."),
    (r"^gnn_layers\.(\d+)\.edge_embedder\.", r"blocks.\1.geometry."),
    (r"^gnn_layers\.(\d+)\.neighbor_embedder\.", r"blocks.\1.neighbor_types."),
    (r"^gnn_layers\.(\d+)\.compress\.0\.", r"blocks.\1.mix_hidden."),
    (r"^gnn_layers\.(\d+)\.compress\.2\.", r"blocks.\1.mix_out."),
    (
        r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.attention\.input_linear\.",
        r"blocks.\1.layers.\2.qkv.",
    ),
    (
        r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.attention\.output_linear\.",
        r"blocks.\1.layers.\2.attn_out.",
    ),
    (
        r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.norm_attention\.",
        r"blocks.\1.layers.\2.attn_norm.",
    ),
    (r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.norm_mlp\.", r"blocks.\1.layers.\2.ffn_norm."),
    (r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.mlp\.w_in\.", r"blocks.\1.layers.\2.ffn.up."),
    (r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.mlp\.w_out\.", r"blocks.\1.layers.\2.ffn.down."),
    (
        r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.center_contraction\.",
        r"blocks.\1.layers.\2.node_in.",
    ),
    (
        r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.center_expansion\.",
        r"blocks.\1.layers.\2.node_out.",
    ),
    (
        r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.norm_center_features\.",
        r"blocks.\1.layers.\2.node_norm.",
    ),
    (
        r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.center_mlp\.w_in\.",
        r"blocks.\1.layers.\2.node_ffn.up.",
    ),
    (
        r"^gnn_layers\.(\d+)\.trans\.layers\.(\d+)\.center_mlp\.w_out\.",
        r"blocks.\1.layers.\2.node_ffn.down.",
    ),
    (r"^combination_norms\.(\d+)\.", r"merge_norms.\1."),
    (r"^combination_mlps\.(\d+)\.0\.", r"merge_hidden.\1."),
    (r"^combination_mlps\.(\d+)\.2\.", r"merge_out.\1."),
    (r"^system_conditioning\.charge_embedding\.", "conditioning.charge_table."),
    (r"^system_conditioning\.spin_multiplicity_embedding\.", "conditioning.spin_table."),
    (r"^system_conditioning\.project\.0\.", "conditioning.hidden."),
    (r"^system_conditioning\.project\.2\.", "conditioning.gate."),
    (r"^(node|edge)_heads\.(\d+)\.0\.", r"\1_heads.\2.hidden."),
    (r"^(node|edge)_heads\.(\d+)\.2\.", r"\1_heads.\2.out."),
    (r"^(node|edge)_last_layers\.(\d+)\.", r"\1_outputs.\2."),
]
#: The members of a metatomic export of metatrain's PET hold its TorchScript code here.
_PET_CODE = "/code/__torch__/metatrain/pet/"
_PER_TARGET = re.compile(
    r"^(node_heads|edge_heads|node_last_layers|edge_last_layers)\.(.+?)\.(\d+)\.(.*)$"
)


@dataclass(frozen=True)
class PETMetadata:
    """What a caller needs next to the core: cutoff, types, units and the energy reference."""

    hypers: PETHypers
    atomic_types: list[int]
    composition_energies: dict[int, float]
    energy_scale: float
    dtype: torch.dtype
    target: str
    length_unit: str = ""
    energy_unit: str = ""
    source: str = field(default="", compare=False)

    @property
    def cutoff(self) -> float:
        """Neighbour-list cutoff (the maximal cutoff for adaptive models)."""
        return self.hypers.cutoff

    def reference(self) -> EnergyReference:
        """Scale and float64 composition energies ordered like the core's atomic types."""
        composition = torch.tensor(
            [self.composition_energies[z] for z in self.atomic_types], dtype=torch.float64
        )
        return EnergyReference(self.energy_scale, composition)


class NotPETModelError(ValueError):
    """The file is neither a metatomic export nor a metatrain checkpoint of a PET model."""


def is_pet_export(path: Path) -> bool:
    """A metatomic export of metatrain's PET: a TorchScript archive holding PET's code."""
    return any(_PET_CODE in name for name in archive_members(path))


def is_pet_checkpoint(path: Path) -> bool:
    """A metatrain checkpoint (``torch.save`` of a dict) whose ``architecture_name`` is pet."""
    return _architecture(pickle_strings(path)) == "pet"


def is_pet_file(path: Path) -> bool:
    """A metatomic export or a metatrain checkpoint of PET, told from the file's content
    without loading it."""
    return is_pet_export(path) or is_pet_checkpoint(path)


def _architecture(strings: list[str]) -> str | None:
    """The string after ``architecture_name`` among a pickle's strings, if any."""
    if "architecture_name" not in strings:
        return None
    following = strings[strings.index("architecture_name") + 1 :]
    return following[0] if following else None


def _not_pet(path: Path) -> str:
    """Why the file at ``path`` cannot be read as PET: what it is, if fastcalc can tell."""
    from ..registry import another_family  # the registry imports this module

    if other := another_family(path, "pet"):
        return f"{path} is not a PET model{other}"
    architecture = _architecture(pickle_strings(path))
    if architecture is not None:
        return f"{path} is a metatrain checkpoint of {architecture!r}, not of PET"
    return (f"{path} is neither a metatomic export (.pt) nor a metatrain checkpoint (.ckpt) "
            "of a PET model")


def load_pet(path: str | Path, target: str = "energy") -> tuple[PETCore, PETMetadata]:
    """Read a metatomic export or a metatrain checkpoint of a PET model (on CPU), told
    apart by content, not by suffix; any other file raises :class:`NotPETModelError`.

    The core is returned for inference: in eval mode, weights not requiring gradients.
    """
    path = Path(path)
    if is_pet_checkpoint(path):
        pet = _module_from_checkpoint(path)
        units = (
            pet.dataset_info.length_unit,
            pet.dataset_info.targets[target].unit if target in pet.target_names else "",
        )
    elif not is_pet_export(path):
        raise NotPETModelError(_not_pet(path))
    else:
        from metatomic.torch import load_atomistic_model

        exported = load_atomistic_model(str(path))
        pet = exported.module
        capabilities = exported.capabilities()
        outputs = capabilities.outputs
        units = (capabilities.length_unit, outputs[target].unit if target in outputs else "")
    return _from_pet_module(pet, target, units, str(path))


def pack(model: tuple[PETCore, PETMetadata]) -> bytes:
    """A loaded PET as bytes (weights and metadata, no code) for
    :func:`fastcalc.converted.converted`; :func:`unpack` reads them back."""
    core, metadata = model
    fields = {**asdict(metadata), "dtype": str(metadata.dtype).removeprefix("torch.")}
    buffer = io.BytesIO()
    torch.save({"metadata": json.dumps(fields), "state": core.state_dict()}, buffer)
    return buffer.getvalue()


def unpack(data: bytes) -> tuple[PETCore, PETMetadata]:
    """The PET core and metadata that :func:`pack` turned into ``data``."""
    stored = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    fields = json.loads(stored["metadata"])
    metadata = PETMetadata(**{
        **fields,
        "hypers": PETHypers(**fields["hypers"]),
        "composition_energies": {int(z): e for z, e in fields["composition_energies"].items()},
        "dtype": getattr(torch, fields["dtype"]),
    })
    core = PETCore(metadata.hypers, metadata.atomic_types).to(metadata.dtype)
    core.load_state_dict(stored["state"])
    return core.eval().requires_grad_(False), metadata


def _module_from_checkpoint(path: Path) -> Any:
    """Rebuild metatrain's PET from a checkpoint (upgrading old checkpoint versions)."""
    try:
        from metatrain.utils.io import model_from_checkpoint
    except ImportError as error:
        raise ImportError(
            f"reading the metatrain checkpoint {path} requires metatrain to be installed"
        ) from error
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    return model_from_checkpoint(checkpoint, context="export")


def _class_name(module: Any) -> str:
    """Class name of a Python or TorchScript module."""
    return getattr(module, "original_name", type(module).__name__)


def _from_pet_module(
    pet: Any, target: str, units: tuple[str, str], source: str
) -> tuple[PETCore, PETMetadata]:
    """Turn metatrain's PET module (Python or TorchScript) into a PETCore and its metadata."""
    if _class_name(pet) != "PET":
        raise ValueError(
            f"{source} does not contain a metatrain PET model (found {_class_name(pet)})"
        )
    additive = [_class_name(m) for m in pet.additive_models.children()]
    unsupported_features(zbl="ZBL" in additive, long_range=bool(pet.long_range))
    if set(additive) - {"CompositionModel"}:
        raise NotImplementedError(f"PET additive models {additive} are not supported by fastcalc")
    if target not in list(pet.target_names):
        raise ValueError(f"{source} has no target {target!r}; it has {list(pet.target_names)}")

    hypers = _read_hypers(pet)
    atomic_types = [int(z) for z in pet.atomic_types]
    state = pet.state_dict()
    weights = _core_state_dict(
        pet.backend,
        {k[len("backend.") :]: v for k, v in state.items() if k.startswith("backend.")},
        target,
    )
    dtype = next(v.dtype for v in weights.values() if v.is_floating_point())
    core = PETCore(hypers, atomic_types).to(dtype)
    core.load_state_dict(weights)

    metadata = PETMetadata(
        hypers=hypers,
        atomic_types=atomic_types,
        composition_energies=_composition(state, target, atomic_types),
        energy_scale=_scale(state, target),
        dtype=dtype,
        target=target,
        length_unit=units[0],
        energy_unit=units[1],
        source=source,
    )
    return core.eval().requires_grad_(False), metadata


def _read_hypers(pet: Any) -> PETHypers:
    """Hyper-parameters from the attributes metatrain keeps on PET and its backend."""
    backend = pet.backend
    values = {name: getattr(backend, name) for name in _HYPER_ATTRIBUTES}
    values["cutoff_width_adaptive"] = float(pet.cutoff_width_adaptive)
    conditioning = backend.system_conditioning
    if conditioning is not None:
        values.update(
            system_conditioning=True,
            max_charge=int(conditioning.max_charge),
            max_spin_multiplicity=int(conditioning.max_spin_multiplicity),
        )
    return PETHypers(**values)


def _fold_lora(backend: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace LoRA-wrapped linears (W x + s B A x) by plain ones with weight W + s B A."""
    modules = dict(backend.named_modules())
    folded = dict(state)
    for key in [k for k in state if k.endswith(".lora_A.weight")]:
        prefix = key[: -len(".lora_A.weight")]
        scaling = float(modules[prefix].scaling)
        low_rank = folded.pop(f"{prefix}.lora_B.weight") @ folded.pop(f"{prefix}.lora_A.weight")
        folded[f"{prefix}.weight"] = folded.pop(f"{prefix}.linear.weight") + scaling * low_rank
        if f"{prefix}.linear.bias" in folded:
            folded[f"{prefix}.bias"] = folded.pop(f"{prefix}.linear.bias")
    return folded


def _core_state_dict(
    backend: Any, state: dict[str, torch.Tensor], target: str
) -> dict[str, torch.Tensor]:
    """Rename backend weights to PETCore's, keeping only the heads of ``target``."""
    renamed: dict[str, torch.Tensor] = {}
    for key, value in _fold_lora(backend, state).items():
        per_target = _PER_TARGET.match(key)
        if per_target:
            kind, name, layer, rest = per_target.groups()
            if name != target:
                continue
            if kind.endswith("last_layers"):
                rest = _single_block_parameter(rest, value)
            key = f"{kind}.{layer}.{rest}"
        for pattern, replacement in _RENAMES:
            key, count = re.subn(pattern, replacement, key)
            if count:
                break
        renamed[key] = value
    return renamed


def _single_block_parameter(rest: str, value: torch.Tensor) -> str:
    """'<block key>.weight' -> 'weight' for a single-property energy block."""
    parameter = rest.rsplit(".", 1)[1]
    if value.shape[0] != 1:
        raise NotImplementedError("PET energy targets with several properties are not supported")
    return parameter


def _load_tensor_map(buffer: torch.Tensor) -> Any:
    """Decode a metatensor buffer; metatensor can only read it from CPU memory."""
    import metatensor.torch as mts

    return mts.load_buffer(buffer.detach().cpu())


def _composition(
    state: dict[str, torch.Tensor], target: str, atomic_types: list[int]
) -> dict[int, float]:
    """Per-element energies added to every atom (zero for types the model has no weight for)."""
    key = f"additive_models.0.{target}_composition_buffer"
    energies = {z: 0.0 for z in atomic_types}
    if key not in state:
        return energies
    weights = _load_tensor_map(state[key])
    if len(weights.keys) != 1:
        raise NotImplementedError("composition energies with several blocks are not supported")
    block = weights.block(0)
    for z, value in zip(
        block.samples.values[:, 0].tolist(),
        block.values.reshape(len(block.samples), -1)[:, 0].tolist(),
        strict=True,
    ):
        energies[int(z)] = float(value)
    return energies


def _scale(state: dict[str, torch.Tensor], target: str) -> float:
    """The single per-structure energy scale of metatrain's Scaler (1.0 if absent)."""
    key = f"scaler.{target}_scaler_buffer"
    if key not in state:
        return 1.0
    scales = _load_tensor_map(state[key])
    values = scales.block(0).values
    if len(scales.keys) != 1 or values.numel() != 1:
        raise NotImplementedError("per-type or per-property energy scales are not supported")
    return float(values.reshape(()))
