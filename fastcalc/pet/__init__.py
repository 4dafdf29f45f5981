"""PET, metatrain's point-edge transformer, as a pure-torch core with loaders for
metatomic exports (``.pt``) and metatrain checkpoints (``.ckpt``).

Typical use::

    core, metadata = load_pet("model.pt")
    layout = structure_layout(positions, cell, pbc, numbers, metadata.hypers, core.species_index)
    result = evaluate(core, metadata.reference(), positions, cell, layout)
"""

from .core import PETCore
from .energy import EnergyReference, PETResult, apply_reference, energy_and_derivatives, evaluate
from .hypers import PETHypers
from .layout import PETLayout, build_layout, structure_layout
from .load import PETMetadata, load_pet
from .trace import compile_pet, trace_pet

__all__ = [
    "EnergyReference",
    "PETCore",
    "PETHypers",
    "PETLayout",
    "PETMetadata",
    "PETResult",
    "apply_reference",
    "build_layout",
    "compile_pet",
    "energy_and_derivatives",
    "evaluate",
    "load_pet",
    "structure_layout",
    "trace_pet",
]
