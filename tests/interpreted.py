"""Running fastcalc's Triton kernels on the CPU in Triton's interpreter, from a test: the
calls go to :mod:`interpreted_kernels_worker`, a process of its own (Triton reads
``TRITON_INTERPRET`` only when it is imported)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("interpreted_kernels_worker.py")


def interpret(calls: list[tuple[str, tuple]], folder: Path) -> list:
    """The results of ``calls`` ((function, arguments) pairs, as the worker takes them), in
    order, from one interpreter process; ``folder`` holds the files passed to and fro."""
    torch.save(calls, folder / "calls.pt")
    done = subprocess.run([sys.executable, str(WORKER), folder / "calls.pt", folder / "out.pt"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return torch.load(folder / "out.pt")
