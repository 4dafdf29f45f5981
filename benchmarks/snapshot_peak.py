"""What is alive at the peak of a CUDA memory snapshot, and which line allocated it.

Reads a snapshot written by ``profile_phases.py --kernels --snapshot FILE`` (torch's
``_dump_snapshot``), replays its allocations and frees, and lists the blocks alive at
the largest total, each with the innermost Python line that allocated it: for a compiled
model, the line of inductor's generated code, which names the buffer, its shape and the
operation. Point ``--code`` at a copy of inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``
of the profiled run) to print those lines' text.

    python benchmarks/snapshot_peak.py uma.pickle --code inductor-cache --top 30
"""

from __future__ import annotations

import argparse
import linecache
import pickle
from collections import Counter
from pathlib import Path


def allocation_line(event: dict) -> tuple[str, int]:
    """The innermost Python frame of an allocation outside torch's own modules (inductor's
    generated code or the model's), as (file, line)."""
    for frame in event.get("frames", []):
        name = frame["filename"]
        if frame["line"] and "/torch/" not in name:
            return name, frame["line"]
    return "?", 0


def alive_at_peak(trace: list[dict]) -> tuple[int, list[dict]]:
    """The largest sum of live blocks over ``trace`` and the blocks alive then."""
    alive: dict[int, dict] = {}
    total = peak = 0
    at_peak: list[dict] = []
    for event in trace:
        if event["action"] == "alloc":
            alive[event["addr"]] = event
            total += event["size"]
        elif event["action"] == "free_completed" and event["addr"] in alive:
            total -= alive.pop(event["addr"])["size"]
        if total > peak:
            peak, at_peak = total, list(alive.values())
    return peak, at_peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--code", type=Path, help="a copy of inductor's cache folder")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    snapshot = pickle.loads(args.snapshot.read_bytes())
    held = sum(segment["allocated_size"] for segment in snapshot["segments"])
    peak, blocks = alive_at_peak(snapshot["device_traces"][0])
    print(f"allocated before the recorded call: {held / 2**30:.2f} GiB; peak of the recorded "
          f"call: {peak / 2**30:.2f} GiB in {len(blocks)} blocks")
    by_line: Counter = Counter()
    for block in blocks:
        by_line[allocation_line(block)] += block["size"]
    for (name, line), size in by_line.most_common(args.top):
        text = ""
        if args.code is not None:  # generated code lies in {cache}/{two letters}/{file}
            local = args.code / Path(name).parent.name / Path(name).name
            text = linecache.getline(str(local), line).strip()[:110]
        print(f"{size / 2**20:9.1f} MiB  {Path(name).name}:{line}  {text}")

if __name__ == "__main__":
    main()
