"""Drop known noise that native libraries print straight to the stderr file descriptor.

warp (under nvalchemiops) prints "Warp CUDA warning: Could not find or load the NVIDIA
CUDA driver" from C on every import on a machine without a CUDA driver. fastcalc runs
on CPU there by design, so the line only alarms users; warp has no setting that stops
it (``warp.config`` controls its Python-side messages only).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NO_CUDA_DRIVER_NOTICE", "dropping_stderr_lines"]

#: The start of warp's notice on machines without a CUDA driver.
NO_CUDA_DRIVER_NOTICE = b"Warp CUDA warning: Could not find or load the NVIDIA CUDA driver."


@contextmanager
def dropping_stderr_lines(prefix: bytes) -> Iterator[None]:
    """Hold back what is written to file descriptor 2 inside the block, then write it out
    without the lines that start with ``prefix``.

    Works on the descriptor, not ``sys.stderr``, because C code writes there directly.
    Does nothing where there is no descriptor 2.
    """
    if sys.stderr is not None:
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        saved = None
    if saved is None:
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True)
                    if not line.startswith(prefix)]
            if kept:
                os.write(2, b"".join(kept))
