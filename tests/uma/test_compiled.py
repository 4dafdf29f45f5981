"""The compiled path ("default" on CPU) against fairchem, across a re-merge of experts.

Compiling costs about a minute on CPU, so one tiny model and one shared calculator
serve every check here.
"""

from __future__ import annotations

import pytest
from test_against_fairchem import assert_agree
from uma_reference import structures

from fastcalc.bench.upstream import build_checkpoint, default_backbone, fairchem_calculator
from fastcalc.testing import evaluate
from fastcalc.uma import BucketedCalculator

TINY = dict(
    num_layers=1, sphere_channels=8, hidden_channels=8, edge_channels=8, num_distance_basis=8,
    lmax=1, mmax=1,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("uma_tiny") / "tiny.pt"
    build_checkpoint(path, default_backbone(**TINY), "UMA-S-1.2", seed=5)
    calc = BucketedCalculator(
        path, task_name="omat", dtype="float64", device="cpu", compile_mode="default",
        bucket_size=64,
    )
    return calc, fairchem_calculator(path, "omat")


def test_compiled_matches_fairchem_after_composition_change(tiny):
    """Same atom count and edge bucket, other composition: the experts are re-merged in
    place and the one compiled graph must read the new weights, not stale constants."""
    calc, reference = tiny
    atoms = structures()["tiny"][1]
    alloy = atoms.copy()
    alloy.numbers[1] = 6  # SiC: same shape, different composition
    for structure in (atoms, alloy, atoms):
        assert_agree(evaluate(calc, structure), evaluate(reference, structure))
    assert calc.compile_stats == {"graphs": 1, "recompiles": 0}
