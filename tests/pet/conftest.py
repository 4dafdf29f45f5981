"""Session fixtures: every PET variant is built once, exported to a metatomic ``.pt`` and
saved as a metatrain ``.ckpt``; upstream results and loaded cores are memoised."""

from __future__ import annotations

import pytest

from fastcalc.pet import CompiledPETCalculator

from .support import (
    CHARGED_STATE,
    MODEL_VARIANTS,
    BuiltModel,
    Reference,
    build_metatrain_pet,
    make_structure,
    save_both_formats,
    upstream_calculator,
    upstream_results,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "compile: slow torch.compile test (one to two minutes on CPU)"
    )


@pytest.fixture(scope="session")
def pet_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, BuiltModel]:
    """All model variants, keyed by name."""
    directory = tmp_path_factory.mktemp("pet_models")
    return {
        name: save_both_formats(build_metatrain_pet(name, seed), directory, name)
        for seed, name in enumerate(MODEL_VARIANTS)
    }


@pytest.fixture(scope="session")
def reference(pet_models):
    """Memoised upstream results, keyed by (model name, structure name[, charged])."""
    calculators = {}
    cache: dict[tuple, Reference] = {}

    def get(model: str, structure: str, charged: bool = False) -> Reference:
        key = (model, structure, charged)
        if key not in cache:
            if model not in calculators:
                calculators[model] = upstream_calculator(pet_models[model])
            state = CHARGED_STATE if charged else {}
            cache[key] = upstream_results(calculators[model], make_structure(structure), **state)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def loaded(pet_models):
    """Memoised fastcalc (core, metadata), keyed by (model name, file suffix)."""
    from fastcalc.pet.load import load_pet

    cache: dict[tuple[str, str], tuple] = {}

    def get(model: str, suffix: str = ".pt"):
        key = (model, suffix)
        if key not in cache:
            built = pet_models[model]
            cache[key] = load_pet(built.pt if suffix == ".pt" else built.ckpt)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def eager(pet_models):
    """Memoised eager float64 calculators, keyed by model name."""
    cache: dict[str, CompiledPETCalculator] = {}

    def get(model: str) -> CompiledPETCalculator:
        if model not in cache:
            cache[model] = CompiledPETCalculator(
                pet_models[model].pt, device="cpu", dtype="float64", compile_mode="eager"
            )
        return cache[model]

    return get
