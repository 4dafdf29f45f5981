"""Benchmarks: fastcalc's calculators timed against the upstream implementations.

``timing`` times any ASE calculators side by side and records the results with
their force errors; ``stream`` times calculators over a list of different structures;
``throughput`` times structures per second over a set, one at a time and batched;
``upstream`` builds random-weight upstream models (metatrain's PET, fairchem's UMA)
and the upstream calculators, for the benchmarks and the tests; ``suite`` is what
``fastcalc bench`` runs.
"""

from .stream import StreamRecord, plot_stream, stream_structures, time_stream
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
    "StreamRecord",
    "copper",
    "plot_records",
    "plot_stream",
    "ratio_table",
    "stream_structures",
    "time_calculators",
    "time_stream",
    "write_records",
]
