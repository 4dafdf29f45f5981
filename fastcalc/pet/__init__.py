"""PET, metatrain's point-edge transformer, as a pure-torch core with loaders for
metatomic exports (``.pt``) and metatrain checkpoints (``.ckpt``), and an ASE calculator.

Typical use::

    atoms.calc = CompiledPETCalculator("model.pt")  # or a bundled name, or (core, metadata)

or, one level down::

    core, metadata = load_pet("model.pt")
    layout = structure_layout(positions, cell, pbc, numbers, metadata.hypers, core.species_index)
    result = evaluate(core, metadata.reference(), positions, cell, layout)
"""

from .calculator import CompiledPETCalculator
from .core import PETCore
from .energy import EnergyReference, PETResult, apply_reference, energy_and_derivatives, evaluate
from .hypers import PETHypers
from .layout import PETLayout, build_layout, structure_layout
from .load import NotPETModelError, PETMetadata, load_pet
from .padding import PaddedShape, padded_shape
from .trace import graph_inputs, trace_pet

__all__ = [
    "CompiledPETCalculator",
    "EnergyReference",
    "NotPETModelError",
    "PETCore",
    "PETHypers",
    "PETLayout",
    "PETMetadata",
    "PETResult",
    "PaddedShape",
    "apply_reference",
    "build_layout",
    "energy_and_derivatives",
    "evaluate",
    "graph_inputs",
    "load_pet",
    "padded_shape",
    "structure_layout",
    "trace_pet",
]
