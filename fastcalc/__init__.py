"""fastcalc: fast ASE calculators for machine-learned interatomic potentials."""

from .calculator import InvalidAtomsError, PotentialCalculator, TorchCalculator
from .neighbors import NeighborOverflowError, VerletNeighborList, neighbor_list
from .pet import CompiledPETCalculator
from .relax import Relaxed, relax_many
from .kernel_bundle import use_torchs_ptxas
from .uma import BucketedCalculator

use_torchs_ptxas()  # before anything in the process asks Triton for its ptxas version

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
