"""Session fixtures for the UMA tests (checkpoints are built once per session)."""

from __future__ import annotations

import pytest

pytest.importorskip("fairchem.core")

from fastcalc.bench.upstream import (  # noqa: E402
    BuiltCheckpoint,
    build_checkpoint,
    default_backbone,
    fairchem_calculator,
)


@pytest.fixture(scope="session")
def uma_checkpoints(tmp_path_factory) -> dict[str, BuiltCheckpoint]:
    """Two small random-weight checkpoints that cover the code paths of published UMA ones.

    ``main``: lmax = mmax = 2, composition embedding, random (``rand_emb``) charge/spin
    embeddings, ``model_id = "UMA-S-1.2"`` (whose composition mean includes an extra zero
    row), many neighbours allowed. ``variant``: lmax = 3, mmax = 1, ``pos_emb`` charge/spin
    embeddings, no composition embedding, "pnorm" expert coefficients, experts in the
    second block only, a small ``max_neighbors`` so that fairchem's neighbour-limiting
    rule is exercised, and ``supports_single_atoms`` (fairchem refuses a lone atom
    without periodic boundaries for ``main``, evaluates it for ``variant``).
    """
    folder = tmp_path_factory.mktemp("uma_checkpoints")
    return {
        "main": build_checkpoint(folder / "main.pt", default_backbone(), "UMA-S-1.2", seed=11),
        "variant": build_checkpoint(
            folder / "variant.pt",
            default_backbone(
                lmax=3,
                mmax=1,
                chg_spin_emb_type="pos_emb",
                use_composition_embedding=False,
                max_neighbors=6,
                moe_expert_coefficient_norm="pnorm",
                layers_moe=[1],  # block 0 keeps plain linear maps
            ),
            "UMA-S-1.2.1",
            seed=23,
            supports_single_atoms=True,
        ),
    }


@pytest.fixture(scope="session")
def reference_calculator(uma_checkpoints):
    """``reference_calculator(kind, task)``: cached fairchem calculators."""
    cache = {}

    def get(kind: str, task: str):
        if (kind, task) not in cache:
            cache[kind, task] = fairchem_calculator(uma_checkpoints[kind].path, task)
        return cache[kind, task]

    return get


@pytest.fixture(scope="session")
def our_calculator(uma_checkpoints):
    """``our_calculator(kind, task)``: cached eager float64 fastcalc UMA calculators,
    with small buckets so that padding is always present."""
    from fastcalc.uma import BucketedCalculator

    cache = {}

    def get(kind: str, task: str):
        if (kind, task) not in cache:
            cache[kind, task] = BucketedCalculator(
                uma_checkpoints[kind].path, task_name=task, dtype="float64", device="cpu",
                compile_mode="eager", bucket_size=64,
            )
        return cache[kind, task]

    return get
