"""One process of the ``first-result`` workload, run as a script (by path, so that the
``fastcalc.bench`` package is not imported: a user's script does not import it).

``python first_result_process.py FAMILY IMPL MODEL DEVICE STRUCTURE`` imports what a user
imports (fastcalc, or the upstream package), builds the calculator of ``MODEL``, reads
``STRUCTURE`` with ASE, evaluates energy, forces and stress once and prints the moments
its imports, the calculator and the result were done (``time.time()``) as JSON; for
fastcalc, whose first calls may run uncompiled, also the moment a call after
``wait_for_compilation`` was done (``compiled_at``). For an
upstream calculator it also imports fastcalc's helper that builds it
(:mod:`fastcalc.bench.upstream`), after its own imports; ``harness_s``, the seconds that
took, is not the upstream's to pay. fastcalc logs where its first call's time went to
standard error.
"""

import importlib
import json
import logging
import sys
import time

#: The package each upstream calculator imports.
UPSTREAM_PACKAGES = {"metatomic": "metatomic.torch", "fairchem": "fairchem.core"}


def main(family: str, impl: str, model: str, device: str, structure: str) -> None:
    """Build ``impl``'s calculator of ``model``, evaluate ``structure``, print the moments."""
    logging.basicConfig(format="%(message)s")
    logging.getLogger("fastcalc").setLevel(logging.INFO)
    import ase.io

    harness_s = 0.0
    if impl == "fastcalc":
        from fastcalc.models import load_calculator

        imported_at = time.time()
        calculator = load_calculator(model, task="omat" if family == "uma" else None,
                                     device=device)
    else:
        importlib.import_module(UPSTREAM_PACKAGES[impl])
        imported_at = time.time()
        from pathlib import Path

        from fastcalc.bench.upstream import fairchem_preset_calculator, metatomic_calculator

        harness_s = time.time() - imported_at
        calculator = (metatomic_calculator(Path(model), device) if impl == "metatomic"
                      else fairchem_preset_calculator(Path(model), "omat", device))
    built_at = time.time()
    atoms = ase.io.read(structure)
    atoms.calc = calculator
    atoms.get_potential_energy()
    atoms.get_forces()
    atoms.get_stress()
    done_at = time.time()
    compiled_at = None
    if impl == "fastcalc":  # then the first result of compiled code
        calculator.wait_for_compilation()
        atoms.rattle(0.001, seed=2)
        atoms.get_forces()
        compiled_at = time.time()
    print(json.dumps({"imported_at": imported_at, "built_at": built_at, "done_at": done_at,
                      "compiled_at": compiled_at, "harness_s": harness_s}))


if __name__ == "__main__":
    main(*sys.argv[1:])
