"""Reference material for the UMA tests: random-weight UMA checkpoints built and
saved with fairchem-core's own classes, fairchem's calculator, test structures.

Two small architectures cover the code paths of published UMA checkpoints:

* ``main``: lmax = mmax = 2, composition embedding, random (``rand_emb``)
  charge/spin embeddings, ``model_id = "UMA-S-1.2"`` (whose composition mean
  includes an extra zero row), many neighbours allowed;
* ``variant``: lmax = 3, mmax = 1, ``pos_emb`` charge/spin embeddings, no
  composition embedding, "pnorm" expert coefficients, experts in the second
  block only, and a small ``max_neighbors`` so that fairchem's
  neighbour-limiting rule is exercised.

Every weight is perturbed so that no path is trivially small, and the EMA
weights differ from the raw weights so that using the wrong set is detected.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

DATASETS = ("oc20", "omat", "omol")
_NORMALIZATION = "fairchem.core.modules.normalization"


@dataclass(frozen=True)
class BuiltCheckpoint:
    path: Path
    backbone: dict


def default_backbone(**changes) -> dict:
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


def _tasks_config(seed: int):
    from omegaconf import OmegaConf

    gen = torch.Generator().manual_seed(seed)
    tasks = []
    for index, dataset in enumerate(DATASETS):
        refs = (torch.randn(101, generator=gen, dtype=torch.float64) * 2.0).tolist()
        energy_norm = {
            "_target_": "fairchem.core.modules.normalization.normalizer.Normalizer",
            "mean": 0.25 * index,
            "rmsd": 1.5 + 0.3 * index,
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
                "rmsd": 2.3,
            },
            "datasets": ["omat"],
            "metrics": ["mae"],
        }
    )
    return [OmegaConf.create(task) for task in tasks]


def build_checkpoint(path: Path, backbone: dict, model_id: str, seed: int) -> BuiltCheckpoint:
    """Instantiate a fairchem HydraModel, randomise it and save an inference checkpoint."""
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
        tasks_config=_tasks_config(seed + 2),
    )
    torch.save(checkpoint, path)
    return BuiltCheckpoint(path, backbone)


def fairchem_calculator(path: Path, task: str, dtype: torch.dtype = torch.float64):
    """fairchem's own ASE calculator: general backend, no MoLE merge, float64 by default."""
    from fairchem.core.calculate.ase_calculator import FAIRChemCalculator
    from fairchem.core.units.mlip_unit.api.inference import InferenceSettings
    from fairchem.core.units.mlip_unit.predict import MLIPPredictUnit

    settings = InferenceSettings(
        merge_mole=False,
        compile=False,
        activation_checkpointing=False,
        external_graph_gen=False,
        base_precision_dtype=dtype,
        execution_mode="general",
    )
    unit = MLIPPredictUnit(str(path), device="cpu", inference_settings=settings)
    return FAIRChemCalculator(unit, task_name=task)


def structures() -> dict:
    """Small test systems: bulk alloy, slab, charged molecule, 2-atom cell, and a
    molecule of two atoms farther apart than the cutoff (no edges at all)."""
    from ase import Atoms
    from ase.build import bulk, fcc111, molecule

    alloy = bulk("Cu", "fcc", a=3.6, cubic=True)
    alloy.numbers[1] = 79
    alloy.rattle(0.1, seed=4)
    slab = fcc111("Pt", (2, 2, 3), vacuum=4.0)
    slab.numbers[0] = 8
    slab.rattle(0.05, seed=2)
    mol = molecule("CH3CH2OH")
    mol.rattle(0.05, seed=5)
    mol.info.update(charge=1, spin=2)
    tiny = bulk("Si", "diamond", a=5.43)
    tiny.rattle(0.05, seed=3)
    isolated = Atoms("CO", positions=[[0.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    isolated.info.update(charge=0, spin=1)
    return {
        "bulk": ("omat", alloy),
        "slab": ("oc20", slab),
        "molecule": ("omol", mol),
        "tiny": ("omat", tiny),
        "isolated": ("omol", isolated),
    }
