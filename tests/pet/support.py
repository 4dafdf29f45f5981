"""Test support: tiny random-weight PET models built with metatrain, test structures,
upstream (metatomic ASE calculator) and fastcalc evaluation helpers."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from ase import Atoms

pytest.importorskip("metatrain.pet")
mts = pytest.importorskip("metatensor.torch")

from metatomic.torch import ModelMetadata  # noqa: E402
from metatrain.pet.modules.finetuning import apply_finetuning_strategy  # noqa: E402

from fastcalc.bench.upstream import metatomic_calculator, pet_model  # noqa: E402
from fastcalc.pet.energy import PETResult, evaluate  # noqa: E402
from fastcalc.pet.layout import structure_layout  # noqa: E402

ATOMIC_TYPES = [1, 6, 8]
COMPOSITION = {1: -1.25, 6: -7.5, 8: -4.125}
ENERGY_SCALE = 2.75
SMALL = dict(
    cutoff=4.0,
    d_pet=8,
    d_head=8,
    d_node=16,
    d_feedforward=16,
    num_heads=2,
    num_attention_layers=1,
    num_gnn_layers=2,
)

MODEL_VARIANTS = {
    # feed-forward featurizer, RMSNorm, SwiGLU, pre-LN, bump cutoff, d_node != d_pet
    "fixed": {},
    "adaptive": dict(num_neighbors_adaptive=6, cutoff_width_adaptive=0.75),
    # every other choice: residual featurizer, LayerNorm, SiLU, post-LN, cosine, d_node == d_pet
    "residual": dict(
        featurizer_type="residual",
        normalization="LayerNorm",
        activation="SiLU",
        transformer_type="PostLN",
        cutoff_function="Cosine",
        cutoff_width=0.8,
        d_node=8,
        num_attention_layers=2,
        attention_temperature=0.7,
    ),
    "conditioned": dict(system_conditioning=True, max_charge=3, max_spin_multiplicity=4),
    "lora": {},
    # the smallest graph (for the compile test): one residual layer, widths equal, SiLU
    "single_layer": dict(num_gnn_layers=1, featurizer_type="residual", d_node=8, activation="SiLU"),
}


#: The compile tests' model: the smallest graph (one residual layer) that still has every
#: graph input in use: adaptive cutoffs (pool pairs) and charge/spin conditioning.
COMPILE_TEST_SIZES = dict(
    SMALL,
    num_neighbors_adaptive=6,
    cutoff_width_adaptive=0.75,
    system_conditioning=True,
    max_charge=3,
    max_spin_multiplicity=4,
)


@dataclass(frozen=True)
class BuiltModel:
    """A metatrain PET saved in both formats."""

    name: str
    pt: Path
    ckpt: Path


def _set_tensor_map_values(module: torch.nn.Module, buffer_name: str, values: torch.Tensor) -> None:
    """Overwrite the single block of a metatensor buffer with ``values``."""
    tensor_map = mts.load_buffer(getattr(module, buffer_name))
    block = tensor_map.block(0)
    block.values[:] = values.reshape(block.values.shape)
    setattr(module, buffer_name, mts.save_buffer(mts.make_contiguous(tensor_map)))


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Random weights everywhere (metatrain zero-initialises e.g. the conditioning gate and
    LoRA's B); normalisation gains stay around one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            noise = 0.4 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            gain = "norm" in name and name.endswith("weight")
            parameter.copy_(noise + 1.0 if gain else noise)


def metatrain_hypers(name: str, sizes: dict | None = None, **changes) -> dict:
    """The test ``sizes``, variant and ``changes``, to go over metatrain's default PET
    hyper-parameters.

    ``sizes`` replaces the tiny test widths (``SMALL``); ``{}`` keeps metatrain's defaults.
    """
    return {**(SMALL if sizes is None else sizes), **MODEL_VARIANTS[name], **changes}


def build_metatrain_pet(
    name: str, seed: int = 0, sizes: dict | None = None, randomize: bool = True
):
    """A random-weight float64 metatrain PET with explicit composition energies and scale.

    ``randomize=False`` keeps metatrain's own initialisation (realistic magnitudes).
    """
    model = pet_model(metatrain_hypers(name, sizes), ATOMIC_TYPES)
    model = model.to(torch.float64)
    if name == "lora":
        config = {"method": "lora", "config": {"rank": 2, "alpha": 3.0}, "inherit_heads": {}}
        model = apply_finetuning_strategy(model, config)
        model.finetune_config = config
    if randomize:
        _randomize(model.backend, seed)

    composition = model.additive_models[0]
    energies = torch.tensor([COMPOSITION[z] for z in ATOMIC_TYPES], dtype=torch.float64)
    _set_tensor_map_values(composition, "energy_composition_buffer", energies)
    composition.sync_tensor_maps()
    scale = torch.tensor([ENERGY_SCALE], dtype=torch.float64)
    for buffer in ("energy_scaler_buffer", "energy_per_target_scaler_buffer"):
        _set_tensor_map_values(model.scaler, buffer, scale)
    model.scaler.sync_tensor_maps()
    return model


def compile_test_model(directory: Path) -> "BuiltModel":
    """The compile tests' model (see ``COMPILE_TEST_SIZES``), exported."""
    model = build_metatrain_pet("single_layer", seed=11, sizes=COMPILE_TEST_SIZES)
    return save_both_formats(model, directory, "compile_test")


def save_both_formats(model, directory: Path, name: str) -> BuiltModel:
    """Export to ``.pt`` and save a ``.ckpt`` of the same weights."""
    pt, ckpt = directory / f"{name}.pt", directory / f"{name}.ckpt"
    checkpoint = model.get_checkpoint()
    # as metatrain's trainer does: the exported weights carry the fine-tuning setup
    checkpoint["best_model_state_dict"]["finetune_config"] = model.finetune_config
    torch.save(checkpoint, ckpt)
    model.export(metadata=ModelMetadata(name=f"fastcalc test PET {name}")).save(str(pt))
    return BuiltModel(name, pt, ckpt)


STRUCTURES = ("bulk", "slab", "molecule", "tiny", "isolated", "single")


def _random_positions(
    rng: np.random.Generator, count: int, low: np.ndarray, high: np.ndarray
) -> np.ndarray:
    """Uniform points at least 0.9 A apart (rejection sampling, non-periodic distances)."""
    points: list[np.ndarray] = []
    while len(points) < count:
        candidate = rng.uniform(low, high)
        if all(np.linalg.norm(candidate - p) > 0.9 for p in points):
            points.append(candidate)
    return np.array(points)


def make_structure(kind: str) -> Atoms:
    """Small test structures with H, C and O."""
    rng = np.random.default_rng(STRUCTURES.index(kind))
    if kind == "bulk":
        cell = np.diag([5.2, 4.8, 5.0]) + rng.normal(0.0, 0.3, (3, 3))
        positions = _random_positions(rng, 10, np.zeros(3), np.full(3, 3.8))
        atoms = Atoms(rng.choice(ATOMIC_TYPES, 10), positions=positions, cell=cell, pbc=True)
    elif kind == "slab":
        cell = np.array([[4.5, 0.0, 0.0], [0.7, 4.3, 0.0], [0.0, 0.0, 14.0]])
        positions = _random_positions(rng, 9, np.array([0.0, 0.0, 5.0]), np.array([4.0, 4.0, 8.5]))
        atoms = Atoms(
            rng.choice(ATOMIC_TYPES, 9), positions=positions, cell=cell, pbc=[True, True, False]
        )
    elif kind == "molecule":
        positions = _random_positions(rng, 8, np.zeros(3), np.full(3, 3.5))
        atoms = Atoms(rng.choice(ATOMIC_TYPES, 8), positions=positions, pbc=False)
    elif kind == "tiny":
        cell = np.array([[2.3, 0.1, 0.0], [0.2, 2.1, 0.1], [0.0, 0.3, 2.4]])
        atoms = Atoms(
            [6, 8], scaled_positions=[[0.1, 0.2, 0.1], [0.55, 0.6, 0.45]], cell=cell, pbc=True
        )
    elif kind == "isolated":
        # a water-like trimer and one atom with no neighbour at all
        positions = [[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0], [9.0, 0.0, 0.0]]
        atoms = Atoms([8, 1, 1, 6], positions=positions, pbc=False)
    else:
        atoms = Atoms([6], positions=[[0.0, 0.0, 0.0]], pbc=False)
    atoms.rattle(0.05, seed=1)
    return atoms


PERIODIC_STRUCTURES = ("bulk", "tiny")
CHARGED_STATE = dict(charge=1, spin_multiplicity=2)


@dataclass(frozen=True)
class Reference:
    """Upstream results (metatomic's ASE calculator on the exported model)."""

    energy: float
    forces: np.ndarray
    stress: np.ndarray | None


def upstream_calculator(model: BuiltModel):
    """metatomic's ASE calculator on the exported model."""
    return metatomic_calculator(model.pt, "cpu")


def upstream_results(
    calculator, atoms: Atoms, charge: int = 0, spin_multiplicity: int = 1
) -> Reference:
    """Energy, forces and (for 3D-periodic cells) the 3x3 stress from metatomic_ase."""
    atoms = atoms.copy()
    atoms.info.update(charge=charge, spin_multiplicity=spin_multiplicity)
    atoms.calc = calculator
    # TorchScript's optimising executor costs seconds per new shape, far more than it saves
    with torch.jit.optimized_execution(False), warnings.catch_warnings():
        # the calculator also forms a (meaningless) stress for zero-volume cells
        warnings.simplefilter("ignore", RuntimeWarning)
        forces = atoms.get_forces()
        stress = atoms.get_stress(voigt=False) if atoms.pbc.all() else None
        return Reference(atoms.get_potential_energy(), forces, stress)


def run_fastcalc(
    core, metadata, atoms: Atoms, charge: int = 0, spin_multiplicity: int = 1
) -> PETResult:
    """Our energy, forces and stress for ``atoms`` (float64 inputs)."""
    positions = torch.tensor(atoms.positions, dtype=metadata.dtype)
    cell = torch.tensor(atoms.cell.array, dtype=metadata.dtype)
    numbers = torch.tensor(atoms.numbers)
    layout = structure_layout(
        positions, cell, atoms.pbc, numbers, metadata.hypers, core.species_index
    )
    return evaluate(core, metadata.reference(), positions, cell, layout, charge, spin_multiplicity)
