"""fastcalc: fast ASE calculators for machine-learned interatomic potentials."""

from .calculator import InvalidAtomsError, PotentialCalculator, TorchCalculator
from .neighbors import NeighborOverflowError, VerletNeighborList, neighbor_list
from .pet import CompiledPETCalculator
from .uma import BucketedCalculator

__all__ = [
    "BucketedCalculator",
    "CompiledPETCalculator",
    "InvalidAtomsError",
    "NeighborOverflowError",
    "PotentialCalculator",
    "TorchCalculator",
    "VerletNeighborList",
    "neighbor_list",
]
__version__ = "0.1.0"
