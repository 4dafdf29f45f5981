"""The benchmark harness times every implementation on the same calls and records each
time next to its force error against an accurate reference."""

import gc
import json
import weakref

import numpy as np
import pytest
import torch
from ase.calculators.calculator import all_changes
from ase.calculators.morse import MorsePotential
from pair_potential import CUTOFF, ase_morse, morse_energy

from fastcalc import PotentialCalculator
from fastcalc.bench import (
    BenchRecord,
    copper,
    plot_records,
    ratio_table,
    time_calculators,
    write_records,
)
from fastcalc.bench.stream import plot_stream, stream_structures, time_stream
from fastcalc.bench.throughput import (
    in_chunks,
    many_at_once,
    one_at_a_time,
    plot_throughput,
    throughput_sets,
    throughput_table,
    time_throughput,
)
from fastcalc.calculator import InvalidAtomsError
from fastcalc.bench.upstream import PET_ELEMENTS

THROUGHPUT_KEYS = {"date", "gpu", "torch", "model", "impl", "structure_set", "structures",
                   "atoms", "structures_per_s", "pass_s", "first_pass_s", "recompiles",
                   "energy_err_ev", "force_err_ev_a", "force_rel_err", "error"}
RECORD_KEYS = {"date", "gpu", "torch", "model", "natoms", "impl", "median_ms", "p90_ms",
               "force_rel_err", "warmup_s", "peak_mem_gib", "recompiles"}


def test_records_one_row_per_implementation_and_plots_them(tmp_path):
    calculators = {
        "fastcalc": lambda: PotentialCalculator(morse_energy, CUTOFF, device="cpu"),
        "ase": ase_morse,
    }
    records = time_calculators(calculators, copper(32), "morse", reference=ase_morse,
                               warmup=1, calls=3)
    assert [r.impl for r in records] == ["fastcalc", "ase"]
    for record in records:
        assert record.natoms == 32 and record.model == "morse" and record.gpu == "cpu"
        assert 0 < record.median_ms <= record.p90_ms
        assert record.warmup_s > 0 and record.recompiles == 0
    write_records(records, tmp_path / "bench.json")
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert set(rows[0]) == RECORD_KEYS
    plot_records(records, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_force_error_is_float32_round_off_for_fastcalc_and_zero_for_the_reference_itself():
    calculators = {
        "fastcalc": lambda: PotentialCalculator(morse_energy, CUTOFF, device="cpu"),
        "ase": ase_morse,
    }
    records = time_calculators(calculators, copper(32), "morse", reference=ase_morse,
                               warmup=0, calls=1)
    errors = {r.impl: r.force_rel_err for r in records}
    assert errors["ase"] == 0.0
    assert 0.0 < errors["fastcalc"] < 1e-5


def test_force_error_is_relative_to_the_largest_reference_force():
    # Morse forces scale with epsilon: against 1.01 epsilon, |F - F_ref| = 0.01/1.01 |F_ref|
    def stronger() -> MorsePotential:
        calc = ase_morse()
        calc.set(epsilon=1.01 * calc.parameters.epsilon)
        return calc

    (record,) = time_calculators({"ase": ase_morse}, copper(32), "morse", reference=stronger,
                                 warmup=1, calls=2)
    assert record.force_rel_err == pytest.approx(0.01 / 1.01, rel=1e-9)


class Recording(MorsePotential):
    """ASE's Morse potential that keeps the positions of every evaluation."""

    def __init__(self, seen: list):
        calc = ase_morse()
        super().__init__(**calc.parameters)
        self.seen = seen

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        self.seen.append((len(atoms), atoms.positions.copy()))
        super().calculate(atoms, properties, system_changes)


def test_force_error_is_measured_on_the_positions_of_the_first_timed_call():
    reference, timed = [], []
    time_calculators({"ase": lambda: Recording(timed)}, copper(32), "morse",
                     reference=lambda: Recording(reference), warmup=2, calls=3)
    assert len(reference) == 1 and len(timed) == 5
    np.testing.assert_array_equal(reference[0][1], timed[2][1])  # after 2 warm-up calls


def test_the_reference_calculator_is_freed_before_the_timed_ones_are_built():
    """A reference caught in a reference cycle is collected at once, not during a later
    calculator's warm-up, where freeing its GPU memory would shrink that one's measured
    peak (fairchem's 0.00 GiB at 108 atoms on the H200)."""
    references = []

    def cyclic():
        calc = ase_morse()
        calc.itself = calc  # a cycle, as fastcalc's calculators have
        references.append(weakref.ref(calc))
        return calc

    alive_at_build = []

    def timed():
        alive_at_build.append(references[0]() is not None)
        return ase_morse()

    enabled = gc.isenabled()
    gc.disable()  # only the harness's own collection may free the reference
    try:
        time_calculators({"ase": timed}, copper(32), "morse", reference=cyclic,
                         warmup=0, calls=1)
    finally:
        if enabled:
            gc.enable()
    assert alive_at_build == [False]


def test_ratio_table_puts_both_implementations_of_a_size_on_one_row():
    def record(impl, ms, error):
        return BenchRecord("2026-11-30", "cpu", "2.13", "m", 64, impl, ms, ms, error, 1.0, 0.5, 0)

    table = ratio_table([record("upstream", 30.0, 2e-6), record("fastcalc", 10.0, 3e-7)],
                        "upstream")
    assert table.splitlines()[2] == (
        "| 64 | 30.00 | 10.00 | 3.00x | 2.0e-06 / 3.0e-07 | 1.0 / 1.0 | 0.50 / 0.50 | 0 |"
    )


def test_the_stream_is_ten_or_more_distinct_cells_of_32_to_500_atoms():
    structures = [atoms for _, atoms in stream_structures()]
    assert len(structures) >= 10
    assert all(32 <= len(atoms) <= 500 for atoms in structures)
    assert len({(len(a), a.cell.cellpar().round(3).tobytes()) for a in structures}) == len(
        structures
    )


def test_the_stream_has_bulk_of_several_shapes_slabs_with_vacuum_and_two_elements():
    structures = [atoms for _, atoms in stream_structures()]
    angles = {tuple(a.cell.cellpar()[3:].round(1)) for a in structures}
    assert len(angles) >= 3  # cubic (90, 90, 90), primitive fcc (60, 60, 60), hcp, triclinic
    slabs = [a for a in structures if a.cell.lengths()[2] - np.ptp(a.positions[:, 2]) > 10.0]
    assert len(slabs) >= 2
    assert any(len(set(a.numbers)) == 2 for a in structures)


def test_every_stream_element_is_known_to_the_pet_random_model():
    for small in (False, True):
        numbers = {int(z) for _, atoms in stream_structures(small) for z in atoms.numbers}
        assert numbers <= set(PET_ELEMENTS)


def test_stream_builds_each_calculator_once_and_calls_it_on_every_structure(tmp_path):
    structures = [atoms for _, atoms in stream_structures(small=True)]
    seen, built = [], []

    def recording():
        built.append(1)
        return Recording(seen)

    def fastcalc():
        return PotentialCalculator(morse_energy, CUTOFF, device="cpu")

    records = time_stream({"ase": recording, "fastcalc": fastcalc}, structures, "morse", calls=2)
    assert len(built) == 1
    assert [natoms for natoms, _ in seen] == [len(a) for a in structures for _ in range(2)]
    assert len({positions.tobytes() for _, positions in seen}) == 6  # displaced every call
    for record in records:
        assert (record.structures, record.calls, len(record.call_s)) == (3, 6, 6)
        assert 0 < record.first_result_s < record.total_s
        assert record.total_s == pytest.approx(
            record.first_result_s - record.call_s[0] + sum(record.call_s)
        )
    write_records(records, tmp_path / "stream.json")
    rows = json.loads((tmp_path / "stream.json").read_text())
    assert set(rows[0]) == {"date", "gpu", "torch", "model", "impl", "structures", "calls",
                            "total_s", "first_result_s", "call_s"}
    plot_stream(records, tmp_path / "stream.png")
    assert (tmp_path / "stream.png").read_bytes()[:4] == b"\x89PNG"


def test_throughput_sets_are_256_copper_cells_and_64_mixed_structures_all_rattled_apart():
    (copper_name, cells), (mixed_name, mixed) = throughput_sets().items()
    assert (copper_name, mixed_name) == ("fcc Cu 64 atoms x 256", "mixed 32-500 atoms x 64")
    assert len(cells) == 256 and {len(a) for a in cells} == {64}
    assert len(mixed) == 64 and all(32 <= len(a) <= 500 for a in mixed)
    assert len({len(a) for a in mixed}) >= 8
    for structures in (cells, mixed):
        assert len({a.positions.tobytes() for a in structures}) == len(structures)
    for small in (False, True):
        numbers = {int(z) for s in throughput_sets(small).values() for a in s for z in a.numbers}
        assert numbers <= set(PET_ELEMENTS)


def test_throughput_times_each_evaluator_over_the_set_beside_its_error(tmp_path):
    structures = next(iter(throughput_sets(small=True).values()))
    fastcalc = PotentialCalculator(morse_energy, CUTOFF, device="cpu")
    evaluators = {
        "fastcalc": lambda: one_at_a_time(fastcalc),
        "fastcalc-many": lambda: many_at_once(fastcalc),
        "ase": lambda: in_chunks(one_at_a_time(ase_morse())),
    }
    records = time_throughput(evaluators, structures, "morse", "small", passes=2,
                              reference=lambda: one_at_a_time(ase_morse()))
    assert [r.impl for r in records] == ["fastcalc", "fastcalc-many", "ase"]
    for record in records:
        assert (record.structures, record.atoms, len(record.pass_s)) == (3, 96, 2)
        assert record.structures_per_s == pytest.approx(3 / np.median(record.pass_s))
        assert record.first_pass_s > 0 and record.recompiles == 0
    errors = {r.impl: (r.energy_err_ev, r.force_err_ev_a, r.force_rel_err) for r in records}
    assert errors["ase"] == (0.0, 0.0, 0.0)
    for impl in ("fastcalc", "fastcalc-many"):
        energy, force, relative = errors[impl]
        assert energy < 1e-4 and 0 < force < 1e-4 and relative < 1e-5
    write_records(records, tmp_path / "throughput.json")
    rows = json.loads((tmp_path / "throughput.json").read_text())
    assert set(rows[0]) == THROUGHPUT_KEYS
    plot_throughput(records, tmp_path / "throughput.png")
    assert (tmp_path / "throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_an_implementation_out_of_gpu_memory_is_recorded_as_failed_and_the_rest_timed(tmp_path):
    """Two contenders may not fit on one GPU together: the one that runs out of memory, in
    its first pass or a later one, gets a record naming the error, the others are timed."""
    structures = next(iter(throughput_sets(small=True).values()))
    calls = {"first": 0, "later": 0}

    def out_of_memory_at(call: int, name: str):
        def evaluate(batch):
            calls[name] += 1
            if calls[name] == call:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.46 GiB.\nmore")
            return one_at_a_time(ase_morse())(batch)
        return evaluate

    evaluators = {
        "first": lambda: out_of_memory_at(1, "first"),
        "later": lambda: out_of_memory_at(3, "later"),
        "ase": lambda: one_at_a_time(ase_morse()),
    }
    records = time_throughput(evaluators, structures, "morse", "small", passes=3,
                              reference=lambda: one_at_a_time(ase_morse()))
    by_impl = {r.impl: r for r in records}
    for name in ("first", "later"):
        failed = by_impl[name]
        assert failed.error == "CUDA out of memory. Tried to allocate 1.46 GiB."
        assert failed.pass_s == [] and np.isnan(failed.structures_per_s)
        assert np.isnan(failed.force_rel_err)
    assert calls == {"first": 1, "later": 3}  # nothing called after its failure
    assert not by_impl["ase"].error and len(by_impl["ase"].pass_s) == 3
    assert "| first | failed: CUDA out of memory" in throughput_table(records)
    plot_throughput(records, tmp_path / "throughput.png")


def test_upstream_batches_are_cut_at_max_atoms_in_order():
    structures = [copper(32)] * 5 + [copper(108), copper(32)]
    seen = []

    def evaluate(batch):
        seen.append([len(atoms) for atoms in batch])
        return [(float(index), np.zeros((len(atoms), 3))) for index, atoms in enumerate(batch)]

    results = in_chunks(evaluate, max_atoms=64)(structures)
    assert seen == [[32, 32], [32, 32], [32], [108], [32]]
    assert [energy for energy, _ in results] == [0, 1, 0, 1, 0, 0, 0]


def test_a_structure_evaluate_many_refuses_fails_the_throughput_pass():
    broken = copper(32)
    broken.positions[3] = np.nan
    calc = PotentialCalculator(morse_energy, CUTOFF, device="cpu")
    with pytest.raises(InvalidAtomsError, match="positions of atoms \\[3\\]"):
        many_at_once(calc)([copper(32), broken])
