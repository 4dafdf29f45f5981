"""fastcalc: fast ASE calculators for machine-learned interatomic potentials."""

from .calculator import InvalidAtomsError, PotentialCalculator, TorchCalculator
from .neighbors import NeighborOverflowError, VerletNeighborList, neighbor_list
from .pet import CompiledPETCalculator
from .relax import Relaxed, relax_many
from .uma import BucketedCalculator

__all__ = [
    "BucketedCalculator",
    "CompiledPETCalculator",
    "InvalidAtomsError",
    "NeighborOverflowError",
    "PotentialCalculator",
    "Relaxed",
    "TorchCalculator",
    "VerletNeighborList",
    "neighbor_list",
    "relax_many",
]
__version__ = "0.1.0"
