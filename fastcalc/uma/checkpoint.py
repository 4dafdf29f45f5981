"""Load a fairchem UMA inference checkpoint without fairchem (or omegaconf).

A UMA inference checkpoint (``uma-s-1p2.pt`` style) is a ``torch.save`` of a
pickled ``MLIPInferenceCheckpoint`` with four fields: ``model_config`` (the
hydra model config), ``model_state_dict``, ``ema_state_dict`` (the weights
fairchem uses for inference) and ``tasks_config`` (per-task normalisers and
element references, usually omegaconf ``DictConfig`` objects).

We unpickle it with a restricted unpickler that maps the fairchem and omegaconf
classes to small stand-ins of our own, allows only the torch/builtin globals a
checkpoint needs, and refuses everything else.  The result is plain Python
containers and tensors.
"""

from __future__ import annotations

import pickle
import zipfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: The class of a fairchem inference checkpoint (module, name).
CHECKPOINT_CLASS = ("fairchem.core.units.mlip_unit.api.inference", "MLIPInferenceCheckpoint")
_UMA_BACKBONES = ("escn_md.eSCNMDBackbone", "escn_moe.eSCNMDMoeBackbone")
_UMA_REGISTRY_NAMES = ("escnmd_backbone", "escnmd_moe_backbone")
_SAFE_BUILTINS = {
    "dict", "list", "tuple", "set", "frozenset", "int", "long", "float", "bool",
    "complex", "str", "bytes", "bytearray", "slice", "object",
}
_SAFE_GLOBALS = {
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("torch", "Size"),
    ("torch", "device"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
}


class NotUMACheckpointError(ValueError):
    """The file is not a fairchem UMA inference checkpoint."""


class UnknownTaskError(KeyError):
    """The requested task is not in the checkpoint."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class _Record:
    """Stand-in for any fairchem/omegaconf object: keeps constructor args and state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _record_class(module: str, name: str) -> type:
    return type(name, (_Record,), {"origin": f"{module}.{name}"})


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolve only the globals a UMA checkpoint needs."""

    def find_class(self, module: str, name: str) -> Any:
        root = module.split(".")[0]
        if root in ("fairchem", "omegaconf"):
            return _record_class(module, name)
        if module in ("builtins", "__builtin__") and name in _SAFE_BUILTINS:
            return super().find_class("builtins", "int" if name == "long" else name)
        if (module, name) in _SAFE_GLOBALS or module == "typing":  # typing: config type hints
            return super().find_class(module, name)
        if root == "torch":
            obj = super().find_class(module, name)
            rebuild = name.startswith("_rebuild") or name.endswith("Storage")
            if rebuild or isinstance(obj, torch.dtype):
                return obj
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in a UMA checkpoint")


_pickle_module = types.SimpleNamespace(
    __name__="fastcalc_uma_pickle",
    Unpickler=_RestrictedUnpickler,
    load=lambda f, **kw: _RestrictedUnpickler(f, **kw).load(),
)


def _to_plain(obj: Any) -> Any:
    """Turn omegaconf stand-ins (and nested containers) into plain Python values."""
    if isinstance(obj, _Record):
        origin = type(obj).origin
        state = obj.state if isinstance(obj.state, dict) else {}
        if origin.endswith(("DictConfig", "ListConfig")):
            return _to_plain(state.get("_content"))
        if "omegaconf.nodes" in origin:
            return _to_plain(state.get("_val"))
        raise NotUMACheckpointError(f"unexpected object {origin} in checkpoint config")
    if isinstance(obj, dict):
        return {key: _to_plain(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(value) for value in obj]
    return obj


@dataclass(frozen=True)
class Normaliser:
    """Affine map from the model's normalised output: ``value = raw * rmsd + mean``."""

    mean: float = 0.0
    rmsd: float = 1.0


@dataclass(frozen=True)
class TaskSpec:
    """Everything needed to turn raw model outputs into one task's predictions."""

    name: str  # dataset / task name used by the calculator, e.g. "omol"
    energy: Normaliser
    forces: Normaliser
    stress: Normaliser
    element_references: torch.Tensor | None  # (max Z + 1,) added to the energy


@dataclass
class UMACheckpoint:
    """A parsed UMA inference checkpoint."""

    backbone: dict[str, Any]
    heads: dict[str, Any]
    model_id: str | None
    weights: dict[str, torch.Tensor]  # EMA weights, keys as in the fairchem model
    tasks: dict[str, TaskSpec]
    #: Whether the model may be evaluated on one atom without periodic boundaries
    #: (``model_config["supports_single_atoms"]``; fairchem refuses such an atom otherwise).
    supports_single_atoms: bool = False

    def task(self, name: str) -> TaskSpec:
        """The task called ``name``; raises :class:`UnknownTaskError` listing valid names."""
        if name not in self.tasks:
            raise UnknownTaskError(
                f"unknown task {name!r}; this checkpoint provides {sorted(self.tasks)}"
            )
        return self.tasks[name]


def _scalar(value: Any) -> float:
    try:
        return float(value.item() if isinstance(value, torch.Tensor) else value)
    except (TypeError, ValueError) as err:  # e.g. an unresolved "${...}" interpolation
        raise NotUMACheckpointError(f"task config value {value!r} is not a number") from err


def _normaliser(config: Any) -> Normaliser:
    if not config:
        return Normaliser()
    rmsd = config.get("rmsd", config.get("stdev", 1.0))
    return Normaliser(mean=_scalar(config.get("mean", 0.0)), rmsd=_scalar(rmsd))


def _element_references(config: Any) -> torch.Tensor | None:
    """Element references come as ``{_target_: ElementReferences, element_references: X}``
    where ``X`` is a list, a tensor, or ``{_target_: torch.DoubleTensor, _args_: [list]}``."""
    if config is None:
        return None
    values = config.get("element_references") if isinstance(config, dict) else config
    if isinstance(values, dict):
        args = values.get("_args_") or [values.get("data")]
        values = args[0]
    if values is None:
        return None
    return torch.as_tensor(values, dtype=torch.float64).flatten()


def _parse_tasks(tasks_config: list[dict[str, Any]]) -> dict[str, TaskSpec]:
    by_dataset: dict[str, dict[str, dict[str, Any]]] = {}
    for task in tasks_config:
        for dataset in task.get("datasets", []):
            by_dataset.setdefault(dataset, {})[task["property"]] = task
    specs = {}
    for dataset, props in by_dataset.items():
        if "energy" not in props:
            continue
        energy = _normaliser(props["energy"].get("normalizer"))
        # fairchem derives untrained forces/stress from the energy task's normaliser
        forces = _normaliser(props["forces"].get("normalizer")) if "forces" in props else energy
        stress = _normaliser(props["stress"].get("normalizer")) if "stress" in props else energy
        refs = _element_references(props["energy"].get("element_references"))
        specs[dataset] = TaskSpec(dataset, energy, forces, stress, refs)
    return specs


def _strip_ema_prefix(ema: dict[str, Any]) -> dict[str, torch.Tensor]:
    """fairchem wraps the model in ``AveragedModel``: keys carry one ``module.`` prefix."""
    out = {}
    for key, value in ema.items():
        if key == "n_averaged":
            continue
        out[key[len("module."):] if key.startswith("module.") else key] = value
    return out


def _another_family(path: str | Path) -> str:
    """What the file at ``path`` is, if another model family reads it (see
    :func:`fastcalc.registry.another_family`)."""
    from ..registry import another_family  # the registry imports the families' calculators

    return another_family(Path(path), "uma")


def load_checkpoint(path: str | Path) -> UMACheckpoint:
    """Read a UMA inference checkpoint; fairchem need not be installed.

    A zip-format file (what ``torch.save`` writes) is memory-mapped, so that only the
    weights the core copies are read: a UMA-S checkpoint also holds non-EMA state, and
    reading all 1.2 GB of it took seconds of every process's start."""
    mmap = zipfile.is_zipfile(path)
    try:
        raw = torch.load(
            path, map_location="cpu", pickle_module=_pickle_module, weights_only=False, mmap=mmap
        )
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError) as err:
        raise NotUMACheckpointError(
            f"{path}: not a UMA inference checkpoint ({err}){_another_family(path)}"
        ) from err
    if not (isinstance(raw, _Record) and type(raw).origin == ".".join(CHECKPOINT_CLASS)):
        raise NotUMACheckpointError(
            f"{path}: not a fairchem MLIPInferenceCheckpoint{_another_family(path)}"
        )
    state = raw.state if isinstance(raw.state, dict) else {}
    model_config = _to_plain(state.get("model_config")) or {}
    backbone = dict(model_config.get("backbone") or {})
    model = str(backbone.get("model", ""))
    if not (model.endswith(_UMA_BACKBONES) or model in _UMA_REGISTRY_NAMES):
        raise NotUMACheckpointError(f"{path}: backbone {model!r} is not a UMA (eSCN-MD) backbone")
    ema = state.get("ema_state_dict")
    if not ema:
        raise NotUMACheckpointError(f"{path}: checkpoint has no EMA weights (ema_state_dict)")
    tasks = _parse_tasks(_to_plain(state.get("tasks_config")) or [])
    if not tasks:
        raise NotUMACheckpointError(f"{path}: checkpoint defines no energy task")
    return UMACheckpoint(
        backbone=backbone,
        heads=dict(model_config.get("heads") or {}),
        model_id=model_config.get("model_id"),
        weights=_strip_ema_prefix(ema),
        tasks=tasks,
        supports_single_atoms=bool(model_config.get("supports_single_atoms", False)),
    )
