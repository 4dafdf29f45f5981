"""Random-weight upstream models and the upstream calculators, for benchmarks and tests.

fastcalc is checked and timed against the implementations it replaces: metatrain's PET
exported to metatomic and run by metatomic's ASE calculator, and UMA checkpoints built
with fairchem-core's own classes and run by fairchem's ASE calculator; for lists of
structures, each one's batched path (``metatomic_batched``, ``fairchem_batched``). metatrain,
metatomic-ase and fairchem-core are references, not requirements of fastcalc, so they are
imported inside the functions that need them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from ase import Atoms
from ase.calculators.calculator import Calculator

from ..calculator import to_host
from ..precision import global_tf32
from .throughput import Evaluator, Results

if TYPE_CHECKING:
    from fairchem.core.units.mlip_unit.api.inference import InferenceSettings
    from fairchem.core.units.mlip_unit.predict import MLIPPredictUnit

__all__ = [
    "DATASETS",
    "PET_ELEMENTS",
    "BuiltCheckpoint",
    "build_checkpoint",
    "default_backbone",
    "export_pet",
    "fairchem_batched",
    "fairchem_calculator",
    "fairchem_preset_calculator",
    "fairchem_preset_unit",
    "metatomic_batched",
    "metatomic_calculator",
    "pet_model",
]

#: The UMA checkpoints' datasets (one energy and force head each; stress for omat).
DATASETS = ("oc20", "omat", "omol")
_NORMALIZATION = "fairchem.core.modules.normalization"


@contextmanager
def _needs(package: str) -> Iterator[None]:
    """Turn a failed import into an error that names the package to install."""
    try:
        yield
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"the upstream reference needs {package}, which fastcalc does not install: "
            f"pip install {package}"
        ) from error


def pet_model(hypers: dict, atomic_types: list[int]) -> torch.nn.Module:
    """metatrain's PET with ``hypers`` over its defaults and one energy target in eV,
    initialised by metatrain from torch's global random state."""
    with _needs("metatrain"):
        from metatrain.pet import PET
        from metatrain.utils.architectures import get_default_hypers
        from metatrain.utils.data import DatasetInfo
        from metatrain.utils.data.target_info import get_energy_target_info

    model_hypers = copy.deepcopy(get_default_hypers("pet")["model"])
    model_hypers.update(hypers)
    energy = get_energy_target_info("energy", {"quantity": "energy", "unit": "eV"})
    info = DatasetInfo(
        length_unit="Angstrom", atomic_types=list(atomic_types), targets={"energy": energy}
    )
    return PET(model_hypers, info)


#: The PET random model's elements: copper, and silver for two-element structures.
PET_ELEMENTS = (29, 47)


def export_pet(hypers: dict, path: Path, seed: int = 0) -> Path:
    """A copper and silver PET (metatrain's initialisation after ``torch.manual_seed(seed)``)
    saved as a metatomic ``.pt`` at ``path``."""
    torch.manual_seed(seed)
    pet_model(hypers, list(PET_ELEMENTS)).eval().export().save(str(path))
    return path


def metatomic_calculator(path: Path, device: str) -> Calculator:
    """metatomic's ASE calculator on an exported model (its eager TorchScript model)."""
    with _needs("metatomic-ase"):
        from metatomic_ase import MetatomicCalculator

    return MetatomicCalculator(str(path), device=device)


@dataclass(frozen=True)
class BuiltCheckpoint:
    """A saved random-weight UMA checkpoint and the backbone configuration it was built with."""

    path: Path
    backbone: dict


def default_backbone(**changes) -> dict:
    """fairchem's eSCN-MD mixture-of-experts backbone configuration: a small one
    (lmax = mmax = 2, 2 layers, 3 experts, composition embedding) with ``changes``."""
    config = dict(
        model="fairchem.core.models.uma.escn_moe.eSCNMDMoeBackbone",
        max_num_elements=100,
        sphere_channels=16,
        lmax=2,
        mmax=2,
        otf_graph=True,
        max_neighbors=300,
        cutoff=4.5,
        edge_channels=16,
        num_distance_basis=24,
        direct_forces=False,
        regress_forces=True,
        regress_stress=True,
        num_layers=2,
        hidden_channels=24,
        norm_type="rms_norm_sh",
        act_type="gate",
        ff_type="spectral",
        chg_spin_emb_type="rand_emb",
        dataset_mapping={name: name for name in DATASETS},
        use_dataset_embedding=True,
        num_experts=3,
        use_composition_embedding=True,
        moe_type="so2",
        model_version=1.2,
    )
    config.update(changes)
    return config


def _tasks_config(seed: int, consistent_stress: bool) -> list:
    """Energy and force tasks per dataset and an omat stress task, with random element
    references and normalisers; the stress normaliser is the omat energy's with
    ``consistent_stress``, else a different one."""
    from omegaconf import OmegaConf

    gen = torch.Generator().manual_seed(seed)
    energy_rmsd = {dataset: 1.5 + 0.3 * index for index, dataset in enumerate(DATASETS)}
    tasks = []
    for index, dataset in enumerate(DATASETS):
        refs = (torch.randn(101, generator=gen, dtype=torch.float64) * 2.0).tolist()
        energy_norm = {
            "_target_": "fairchem.core.modules.normalization.normalizer.Normalizer",
            "mean": 0.25 * index,
            "rmsd": energy_rmsd[dataset],
        }
        tasks.append(
            {
                "_target_": "fairchem.core.units.mlip_unit.mlip_unit.Task",
                "name": f"{dataset}_energy",
                "level": "system",
                "property": "energy",
                "out_spec": {"dim": [1], "dtype": "float32"},
                "normalizer": energy_norm,
                "element_references": {
                    "_target_": f"{_NORMALIZATION}.element_references.ElementReferences",
                    "element_references": {"_target_": "torch.DoubleTensor", "_args_": [refs]},
                },
                "datasets": [dataset],
                "metrics": ["mae"],
            }
        )
        tasks.append(
            {
                "_target_": "fairchem.core.units.mlip_unit.mlip_unit.Task",
                "name": f"{dataset}_forces",
                "level": "atom",
                "property": "forces",
                "out_spec": {"dim": [3], "dtype": "float32"},
                "normalizer": {**energy_norm, "mean": 0.0},
                "datasets": [dataset],
                "metrics": ["mae"],
            }
        )
    tasks.append(
        {
            "_target_": "fairchem.core.units.mlip_unit.mlip_unit.Task",
            "name": "omat_stress",
            "level": "system",
            "property": "stress",
            "out_spec": {"dim": [1, 9], "dtype": "float32"},
            "normalizer": {
                "_target_": "fairchem.core.modules.normalization.normalizer.Normalizer",
                "mean": 0.0,
                "rmsd": energy_rmsd["omat"] if consistent_stress else 2.3,
            },
            "datasets": ["omat"],
            "metrics": ["mae"],
        }
    )
    return [OmegaConf.create(task) for task in tasks]


def build_checkpoint(
    path: Path,
    backbone: dict,
    model_id: str,
    seed: int,
    consistent_stress: bool = False,
    supports_single_atoms: bool = False,
) -> BuiltCheckpoint:
    """Instantiate a fairchem HydraModel, randomise it and save an inference checkpoint.

    Every floating-point weight is perturbed so that no path is trivially small, and the
    EMA weights differ from the raw weights so that using the wrong set is detected.
    The stress normaliser differs from the energy's, so that using the wrong one is
    detected too, unless ``consistent_stress``: then, as in trained checkpoints, the
    stress is the strain derivative of the energy. ``supports_single_atoms`` is recorded
    in the model config, as UMA-S-1.2 does: fairchem then evaluates the model on one atom
    without periodic boundaries instead of refusing it.
    """
    with _needs("fairchem-core"):
        import hydra
        from fairchem.core.units.mlip_unit.api.inference import MLIPInferenceCheckpoint

    torch.manual_seed(seed)
    heads = {
        "energyandforcehead": {
            "module": "fairchem.core.models.uma.escn_moe.DatasetSpecificMoEWrapper",
            "head_cls": "fairchem.core.models.uma.escn_md.MLP_EFS_Head",
            "head_kwargs": {"wrap_property": False},
            "dataset_mapping": {name: name for name in DATASETS},
        }
    }
    model_config = {
        "_target_": "fairchem.core.models.base.HydraModel",
        "backbone": copy.deepcopy(backbone),
        "heads": heads,
        "pass_through_head_outputs": True,
        "model_id": model_id,
    }
    if supports_single_atoms:
        model_config["supports_single_atoms"] = True
    model = hydra.utils.instantiate(copy.deepcopy(model_config))
    gen = torch.Generator().manual_seed(seed + 1)
    raw = {}
    ema = {}
    for key, value in model.state_dict().items():
        if value.is_floating_point() and ".Jd_" not in key:  # Jd_* are fixed rotation constants
            value = value + 0.3 * torch.randn(value.shape, generator=gen, dtype=value.dtype)
            raw[key] = value
            noise = torch.randn(value.shape, generator=gen, dtype=value.dtype)
            ema[f"module.{key}"] = value + 0.1 * noise
        else:
            raw[key] = value
            ema[f"module.{key}"] = value.clone()
    ema["n_averaged"] = torch.tensor(7)
    checkpoint = MLIPInferenceCheckpoint(
        model_config=model_config,
        model_state_dict=raw,
        ema_state_dict=ema,
        tasks_config=_tasks_config(seed + 2, consistent_stress),
    )
    torch.save(checkpoint, path)
    return BuiltCheckpoint(path, backbone)


def fairchem_calculator(
    path: Path, task: str, dtype: torch.dtype = torch.float64, device: str = "cpu"
) -> Calculator:
    """fairchem's own ASE calculator, eager: general backend, experts not merged, TF32 off."""
    with _needs("fairchem-core"):
        from fairchem.core.calculate.ase_calculator import FAIRChemCalculator
        from fairchem.core.units.mlip_unit.api.inference import InferenceSettings
        from fairchem.core.units.mlip_unit.predict import MLIPPredictUnit

    settings = InferenceSettings(
        tf32=False,
        merge_mole=False,
        compile=False,
        activation_checkpointing=False,
        external_graph_gen=False,
        base_precision_dtype=dtype,
        execution_mode="general",
    )
    unit = MLIPPredictUnit(str(path), device=device, inference_settings=settings)
    return FAIRChemCalculator(unit, task_name=task)


def fairchem_preset_unit(
    path: Path,
    device: str,
    preset: str | InferenceSettings = "high-precision",
    execution_mode: str | None = None,
) -> MLIPPredictUnit:
    """fairchem's predict unit as a user gets it from a named inference preset (or from
    fairchem's ``InferenceSettings``, which a preset names).

    ``high-precision`` is float32 without TF32, merged experts and ``torch.compile``,
    with the execution backend left to fairchem (``umas_fast_gpu`` for lmax = mmax = 2
    on CUDA, else ``general``); ``execution_mode`` overrides that choice.
    """
    with _needs("fairchem-core"):
        from fairchem.core.units.mlip_unit import load_predict_unit
        from fairchem.core.units.mlip_unit.api.inference import guess_inference_settings

    settings = guess_inference_settings(preset)
    if execution_mode is not None:
        settings = replace(settings, execution_mode=execution_mode)
    return load_predict_unit(str(path), inference_settings=settings, device=device)


def fairchem_preset_calculator(
    path: Path,
    task: str,
    device: str,
    preset: str | InferenceSettings = "high-precision",
    execution_mode: str | None = None,
) -> Calculator:
    """fairchem's ASE calculator on :func:`fairchem_preset_unit`."""
    with _needs("fairchem-core"):
        from fairchem.core.calculate.ase_calculator import FAIRChemCalculator

    unit = fairchem_preset_unit(path, device, preset, execution_mode)
    return FAIRChemCalculator(unit, task_name=task)


def fairchem_batched(
    path: Path, task: str, device: str, preset: str = "high-precision"
) -> Evaluator:
    """fairchem's batched path: each list of structures converted to ``AtomicData``,
    collated into one batch and evaluated by one call of the predict unit of
    :func:`fairchem_preset_unit` (``high-precision`` as the ``fairchem`` contender, or
    ``multigpu``, its TF32 preset, as ``fairchem-tf32``).

    A batch of several compositions breaks the merged experts' contract: fairchem then
    falls back, for this unit's later calls too, to its unmerged model uncompiled.
    """
    with _needs("fairchem-core"):
        from fairchem.core.datasets.atomic_data import AtomicData, atomicdata_list_to_batch

    unit = fairchem_preset_unit(path, device, preset)
    dtype = unit.inference_settings.base_precision_dtype

    def evaluate(structures: list[Atoms]) -> Results:
        batch = atomicdata_list_to_batch(
            [AtomicData.from_ase(atoms, task_name=task, target_dtype=dtype) for atoms in structures]
        )
        predicted = unit.predict(batch)
        energies, forces, _ = to_host(
            predicted["energy"], predicted["forces"], predicted["stress"]
        )
        split = np.cumsum([len(atoms) for atoms in structures])[:-1]
        return list(zip(energies.reshape(-1).tolist(), np.split(forces, split)))

    return evaluate


def metatomic_batched(path: Path, device: str, tf32: bool = False) -> Evaluator:
    """metatomic's batched path: each list of structures evaluated by one call of its ASE
    calculator's ``compute_energy`` (one model call for all, forces and stresses by one
    backward pass). metatomic has no precision setting of its own: with ``tf32`` each call
    runs under torch's global TF32 switch, as a user would turn it on."""
    calculator = metatomic_calculator(path, device)

    def evaluate(structures: list[Atoms]) -> Results:
        with global_tf32() if tf32 else nullcontext():
            out = calculator.compute_energy(list(structures), compute_forces_and_stresses=True)
        return list(zip(np.asarray(out["energy"], dtype=np.float64).tolist(), out["forces"]))

    return evaluate
