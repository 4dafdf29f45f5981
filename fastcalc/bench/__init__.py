"""Benchmarks: fastcalc's calculators timed against the upstream implementations.

``timing`` times any ASE calculators side by side and records the results;
``upstream`` builds random-weight upstream models (metatrain's PET, fairchem's UMA)
and the upstream calculators, for the benchmarks and the tests; ``suite`` is what
``fastcalc bench`` runs.
"""

from .timing import (
    BenchRecord,
    copper,
    plot_records,
    ratio_table,
    time_calculators,
    write_records,
)

__all__ = [
    "BenchRecord",
    "copper",
    "plot_records",
    "ratio_table",
    "time_calculators",
    "write_records",
]
