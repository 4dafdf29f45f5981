"""One compiled UMA graph for every system size ("default" mode on CPU), against fairchem.

Compiling costs about a minute on CPU, so one tiny model and one shared calculator
serve every check here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ase.build import bulk, fcc111, molecule
from test_against_fairchem import assert_agree
from uma_reference import structures

from fastcalc.bench.upstream import build_checkpoint, default_backbone, fairchem_calculator
from fastcalc.testing import evaluate
from fastcalc.tracing import compiled_graphs
from fastcalc.uma import BucketedCalculator

#: A tiny model whose energy head is 32 wide: inductor on CPU turns a (N, 1) x (1, C)
#: product with N + C <= 32 into a broadcast, guarded on N, which would recompile for
#: larger N (real heads are 128 wide, and on CUDA there is no such guard).
TINY = dict(
    num_layers=1, sphere_channels=8, hidden_channels=32, edge_channels=8, num_distance_basis=8,
    lmax=1, mmax=1,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("uma_tiny") / "tiny.pt"
    build_checkpoint(path, default_backbone(**TINY), "UMA-S-1.2", seed=5)
    calc = BucketedCalculator(
        path, task_name="omat", dtype="float64", device="cpu", compile_mode="default",
        bucket_size=64, compile_in_background=False,
    )
    eager = BucketedCalculator(
        path, task_name="omat", dtype="float64", device="cpu", compile_mode="eager",
        bucket_size=64,
    )
    return calc, eager, fairchem_calculator(path, "omat")


def sizes() -> list:
    """Eight atom counts (1 to 27): bulk cells of several shapes, a slab, a molecule."""
    systems = [
        bulk("Cu", "fcc", a=3.6),
        bulk("Cu", "fcc", a=3.6).repeat((2, 1, 1)),
        bulk("Fe", "bcc", a=2.9).repeat((3, 1, 1)),
        bulk("Cu", "fcc", a=3.6, cubic=True),
        molecule("CH3CH2OH"),
        fcc111("Cu", (2, 2, 3), vacuum=4.0),
        bulk("Mg", "hcp", a=3.2).repeat((3, 3, 1)),
        bulk("Cu", "fcc", a=3.6).repeat(3),
    ]
    for seed, atoms in enumerate(systems):
        atoms.rattle(0.05, seed=seed)
    return systems


def test_one_compilation_serves_every_size(tiny):
    """Atom counts 1 to 27 (padded to 8, 16, 24, 32 atoms, edges to several buckets):
    one compilation, and every result equals fairchem's and eager fastcalc's."""
    calc, eager, reference = tiny
    before = compiled_graphs()
    systems = sizes()
    assert len({len(atoms) for atoms in systems}) >= 6
    for atoms in systems:
        ours = evaluate(calc, atoms)
        assert_agree(ours, evaluate(reference, atoms))
        assert_agree(ours, evaluate(eager, atoms))
    assert compiled_graphs() == before + calc.compile_stats["compilations"]
    stats = calc.compile_stats
    assert (stats["compilations"], stats["cuda_graphs"], stats["recompiles"]) == (1, 0, 0)


def test_compiled_matches_fairchem_after_composition_change(tiny):
    """Same atom count and edge bucket, other composition: the experts are re-merged in
    place and the one compiled graph must read the new weights, not stale constants."""
    calc, _, reference = tiny
    atoms = structures()["tiny"][1]
    alloy = atoms.copy()
    alloy.numbers[1] = 6  # SiC: same shape, different composition
    for structure in (atoms, alloy, atoms):
        assert_agree(evaluate(calc, structure), evaluate(reference, structure))
    assert calc.compile_stats["compilations"] == 1


def test_a_second_process_loads_the_stored_graph_without_compiling(tiny, tmp_path):
    """The compiled graph (UMA's edge operators in it) that this process stored in the
    disk cache: a fresh process building the same calculator loads it, compiles nothing
    and gives this process's numbers (to float64 round-off)."""
    calc, _, _ = tiny
    atoms = structures()["tiny"][1]
    ours = evaluate(calc, atoms)
    atoms.write(tmp_path / "atoms.traj")
    script = textwrap.dedent(f"""
        import json
        from ase.io import read
        from fastcalc.uma import BucketedCalculator
        atoms = read({str(tmp_path / "atoms.traj")!r})
        atoms.calc = BucketedCalculator(
            {calc.parameters["checkpoint"]!r}, task_name="omat", dtype="float64",
            device="cpu", compile_mode="default", bucket_size=64,
            compile_in_background=False,
        )
        print(json.dumps({{"energy": atoms.get_potential_energy(),
                          "forces": atoms.get_forces().tolist(),
                          "stats": atoms.calc.compile_stats}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs["stats"]["from_cache"] == 1 and theirs["stats"]["compilations"] == 0
    np.testing.assert_allclose(theirs["energy"], ours.energy, rtol=1e-12)
    np.testing.assert_allclose(theirs["forces"], ours.forces, rtol=1e-10, atol=1e-12)
