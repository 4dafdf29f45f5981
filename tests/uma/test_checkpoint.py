"""Checkpoint loading: works without fairchem, uses EMA weights, parses tasks,
and fails clearly on files and tasks it cannot handle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastcalc.bench.upstream import DATASETS
from fastcalc.uma import NotUMACheckpointError, UMACore, UnknownTaskError, load_checkpoint
from uma_reference import structures

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

_NO_FAIRCHEM = """
import importlib.abc, json, sys
BLOCKED = ("fairchem", "omegaconf", "hydra")

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Block())
sys.path.insert(0, sys.argv[2])
from fastcalc.uma import BucketedCalculator
from uma_reference import structures

task, atoms = structures()["bulk"]
atoms.calc = BucketedCalculator(
    sys.argv[1], task_name=task, dtype="float64", device="cpu", compile_mode="eager"
)
result = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces().tolist(),
          "stress": atoms.get_stress().tolist()}
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED]
print(json.dumps(result))
"""


def test_loads_and_evaluates_without_fairchem(uma_checkpoints, reference_calculator):
    path = uma_checkpoints["main"].path
    python_path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=python_path)
    run = subprocess.run(
        [sys.executable, "-c", _NO_FAIRCHEM, str(path), str(HERE)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ours = json.loads(run.stdout.strip().splitlines()[-1])
    task, atoms = structures()["bulk"]
    atoms.calc = reference_calculator("main", task)
    np.testing.assert_allclose(ours["energy"], atoms.get_potential_energy(), rtol=1e-8)
    np.testing.assert_allclose(ours["forces"], atoms.get_forces(), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(ours["stress"], atoms.get_stress(), rtol=1e-8, atol=1e-8)


def test_uses_ema_weights_and_parses_tasks(uma_checkpoints):
    path = uma_checkpoints["main"].path
    raw = torch.load(path, map_location="cpu", weights_only=False)  # fairchem's own classes
    checkpoint = load_checkpoint(path)
    key = "backbone.blocks.1.edge_wise.so2_conv_1.fc_m0.weights"
    assert torch.equal(checkpoint.weights[key], raw.ema_state_dict[f"module.{key}"])
    assert not torch.equal(checkpoint.weights[key], raw.model_state_dict[key])
    assert "n_averaged" not in checkpoint.weights
    assert checkpoint.model_id == "UMA-S-1.2"
    assert sorted(checkpoint.tasks) == sorted(DATASETS)
    for config in raw.tasks_config:
        dataset = config["datasets"][0]
        spec = checkpoint.tasks[dataset]
        normaliser = getattr(spec, config["property"])
        assert normaliser.mean == pytest.approx(config["normalizer"]["mean"])
        assert normaliser.rmsd == pytest.approx(config["normalizer"]["rmsd"])
        if config["property"] == "energy":
            refs = config["element_references"]["element_references"]["_args_"][0]
            np.testing.assert_array_equal(spec.element_references.numpy(), np.array(refs))
    # no stress task for omol: fairchem falls back to the energy normaliser
    assert checkpoint.tasks["omol"].stress == checkpoint.tasks["omol"].energy


def test_unknown_task_is_a_clear_error(uma_checkpoints):
    checkpoint = load_checkpoint(uma_checkpoints["main"].path)
    with pytest.raises(UnknownTaskError, match=r"unknown task 'omcat'.*'oc20', 'omat', 'omol'"):
        checkpoint.task("omcat")
    with pytest.raises(UnknownTaskError):
        UMACore(checkpoint, "omcat")


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_not_a_checkpoint_is_a_clear_error(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("definitely not a checkpoint")
    plain = tmp_path / "plain.pt"
    torch.save({"model": {"weight": torch.zeros(2)}}, plain)
    hostile = tmp_path / "hostile.pt"
    torch.save({"payload": _Exploit()}, hostile)
    for path in (text, plain, hostile, tmp_path / "missing.pt"):
        with pytest.raises((NotUMACheckpointError, FileNotFoundError)):
            load_checkpoint(path)
    assert not (Path.cwd() / "pwned").exists()
    with pytest.raises(NotUMACheckpointError, match="not allowed"):
        load_checkpoint(hostile)


def test_non_uma_backbone_is_a_clear_error(tmp_path, uma_checkpoints):
    raw = torch.load(uma_checkpoints["main"].path, map_location="cpu", weights_only=False)
    other = {"model": "fairchem.core.models.equiformer_v2.EquiformerV2"}
    raw.model_config = {**raw.model_config, "backbone": other}
    path = tmp_path / "other.pt"
    torch.save(raw, path)
    with pytest.raises(NotUMACheckpointError, match="not a UMA"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "change",
    [
        {"ff_type": "grid"},
        {"act_type": "s2"},
        {"direct_forces": True},
        {"charge_balanced_channels": [0]},
    ],
)
def test_unsupported_architecture_fails_clearly(uma_checkpoints, change):
    checkpoint = load_checkpoint(uma_checkpoints["main"].path)
    checkpoint.backbone.update(change)
    with pytest.raises(NotImplementedError, match=next(iter(change))):
        UMACore(checkpoint, "omat")
