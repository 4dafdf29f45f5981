"""Small demonstration models fitted to EMT copper (see scripts/demo/README.md).

- ``PET_DEMO_CU``: metatrain PET exported as a metatomic TorchScript model (Cu only,
  cutoff 5 A); load with ``metatomic_ase.MetatomicCalculator(PET_DEMO_CU)``.
- ``UMA_DEMO_CU``: fairchem UMA-architecture inference checkpoint (task ``omat``, Cu only,
  cutoff 5 A); load with ``FAIRChemCalculator(load_predict_unit(UMA_DEMO_CU),
  task_name="omat")``.

They reproduce EMT copper, not any real electronic-structure method.
"""

from pathlib import Path

DEMO_MODELS_DIR = Path(__file__).resolve().parent
PET_DEMO_CU = DEMO_MODELS_DIR / "pet-demo-cu.pt"
UMA_DEMO_CU = DEMO_MODELS_DIR / "uma-demo-cu.pt"

#: The elements each bundled model was fitted on; its calculator refuses the others (a UMA
#: checkpoint would otherwise accept all 99 elements of its embedding).
FITTED_ELEMENTS = {PET_DEMO_CU: (29,), UMA_DEMO_CU: (29,)}

__all__ = ["DEMO_MODELS_DIR", "FITTED_ELEMENTS", "PET_DEMO_CU", "UMA_DEMO_CU"]
