"""The benchmark harness times every implementation on the same calls and records it."""

import json

from pair_potential import CUTOFF, ase_morse, morse_energy

from fastcalc import PotentialCalculator
from fastcalc.bench import copper, plot_records, time_calculators, write_records


def test_records_one_row_per_implementation_and_plots_them(tmp_path):
    calculators = {
        "fastcalc": lambda: PotentialCalculator(morse_energy, CUTOFF, device="cpu"),
        "ase": ase_morse,
    }
    records = time_calculators(calculators, copper(32), "morse", warmup=1, calls=3)
    assert [r.impl for r in records] == ["fastcalc", "ase"]
    for record in records:
        assert record.natoms == 32 and record.model == "morse" and record.gpu == "cpu"
        assert 0 < record.median_ms <= record.p90_ms
        assert record.warmup_s > 0 and record.recompiles == 0
    write_records(records, tmp_path / "bench.json")
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert set(rows[0]) == {"date", "gpu", "torch", "model", "natoms", "impl", "median_ms",
                            "p90_ms", "warmup_s", "peak_mem_gib", "recompiles"}
    plot_records(records, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_ratio_table_puts_both_implementations_of_a_size_on_one_row():
    from fastcalc.bench import BenchRecord, ratio_table

    def record(impl, ms):
        return BenchRecord("2026-11-30", "cpu", "2.13", "m", 64, impl, ms, ms, 1.0, 0.5, 0)

    table = ratio_table([record("upstream", 30.0), record("fastcalc", 10.0)], "upstream")
    assert table.splitlines()[2] == "| 64 | 30.00 | 10.00 | 3.00x | 1.0 / 1.0 | 0.50 / 0.50 | 0 |"
