"""The examples run to completion (a few steps each)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[1] / "examples"
README = Path(__file__).parents[1] / "README.md"


def test_pair_potential_md_conserves_energy():
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "pair_potential_md.py"), "20"],
        capture_output=True, text=True, check=True,
    )
    drift = float(result.stdout.split("energy drift")[1].split()[0])
    assert abs(drift) < 0.1, result.stdout


def test_a_third_model_family_is_found_and_passes_check_calculator():
    """examples/morse_family.py registers a family, loads a file of it by its format and
    runs check_calculator against ASE's MorsePotential (which raises on any failure)."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "morse_family.py")],
        capture_output=True, text=True, check=True,
    )
    assert "PotentialCalculator from copper.morse.json" in result.stdout
    assert "checks passed, 1 skipped" in result.stdout  # Morse knows every element


def readme_snippet(heading: str) -> str:
    """The first Python code block of the README's section ``heading``."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


#: The Morse parameters of the examples' copper file.
MORSE_PARAMETERS = dict(epsilon=0.4, rho0=5.0, r0=2.6, rcut1=1.5, rcut2=2.2)


@pytest.fixture
def morse_example(tmp_path, monkeypatch):
    """examples/morse_family.py loaded as a module, its family registered in a registry of
    this test's own; the working folder holds its copper file, copper.morse.json."""
    from fastcalc import registry

    monkeypatch.setattr(registry, "_registered", dict(registry.families()))
    spec = importlib.util.spec_from_file_location("morse_family", EXAMPLES / "morse_family.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.chdir(tmp_path)
    Path("copper.morse.json").write_text(json.dumps(MORSE_PARAMETERS))
    return example


def test_the_readme_snippet_of_adding_a_model_runs_as_written(morse_example, monkeypatch):
    """With examples/morse_family.py's definitions and a fresh registry, the README's lines
    register the family, load a file of it and pass check_calculator (which raises on
    any failed check) against ASE's MorsePotential."""
    from fastcalc import registry

    builtin = {name: family for name, family in registry.families().items() if name != "morse"}
    monkeypatch.setattr(registry, "_registered", builtin)  # the README registers it
    names = {**vars(morse_example), "parameters": MORSE_PARAMETERS}
    exec(readme_snippet("Adding a model"), names)


def test_the_example_family_refuses_a_task_as_the_builder_protocol_asks(morse_example):
    from fastcalc.models import load_calculator
    from fastcalc.registry import TaskNotSupportedError

    with pytest.raises(TaskNotSupportedError, match="no tasks, got task 'omat'"):
        load_calculator("copper.morse.json", task="omat", device="cpu")


def test_cell_relaxation_finds_the_lattice_constant_of_emt():
    """The UMA demo model was fitted to EMT, so it should relax to EMT's lattice constant."""
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.filters import FrechetCellFilter
    from ase.optimize import FIRE

    reference = bulk("Cu", "fcc", a=3.75, cubic=True)
    reference.calc = EMT()
    FIRE(FrechetCellFilter(reference), logfile=None).run(fmax=0.001, steps=300)
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "cell_relaxation.py")],
        capture_output=True, text=True, check=True,
    )
    relaxed = float(result.stdout.split("->")[1].split()[0])
    assert abs(relaxed - reference.cell.lengths()[0]) < 0.02, result.stdout


def test_eager_vs_compiled_notebook_runs(monkeypatch):
    """Run the notebook's code cells (quick mode): every size timed for both calculators."""
    import matplotlib
    import nbformat

    matplotlib.use("Agg")
    monkeypatch.setenv("FASTCALC_EXAMPLE_QUICK", "1")
    notebook = nbformat.read(EXAMPLES / "eager_vs_compiled.ipynb", as_version=4)
    namespace: dict = {}
    for cell in notebook.cells:
        if cell.cell_type == "code":
            exec(compile(cell.source, "eager_vs_compiled.ipynb", "exec"), namespace)
    assert {(r.natoms, r.impl) for r in namespace["records"]} == {
        (n, impl) for n in (32, 108) for impl in ("eager", "compiled")
    }
    assert all(r.median_ms > 0 for r in namespace["records"])
    stats = namespace["built"]["compiled"].compile_stats  # the timed calls ran compiled
    assert stats["compilations"] + stats["from_cache"] == 1 and stats["building"] == 0


def test_surface_energies_of_the_uma_demo_model_match_emt():
    """The UMA demo model was fitted to EMT; its relaxed slabs' surface energies should be
    EMT's, computed with ASE's own FIRE, to a few hundredths of a J/m²."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "surface_energies.py"), "4"],
        capture_output=True, text=True, check=True,
    )
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("(1")]
    assert [row[0] for row in rows] == ["(111)", "(100)", "(110)"], result.stdout
    for face, ours, _, emt, _ in rows:
        assert abs(float(ours) - float(emt)) < 0.03, result.stdout
