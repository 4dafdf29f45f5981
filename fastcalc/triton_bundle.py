"""Triton's compiled kernels of one compilation, carried in a compile cache entry.

A model loaded from fastcalc's disk cache still needs its Triton kernels: inductor's
(which its loaded code compiles again unless Triton's cache has them) and fastcalc's own
(:mod:`fastcalc.uma.edge_kernels`, compiled at their first launch). Triton keeps them in
its cache folder, one sub-folder per kernel (and per launcher module), named by a hash of
everything that went into it. On the H200 a process whose Triton cache was empty spent
6 s of a 10 s first call compiling them again (PET-S-shaped and UMA-S-shaped alike).

So an entry also holds the sub-folders that appeared in Triton's cache folder while its
model was compiled and first run (:func:`listing` before, :func:`pack` after), and a
process that loads the entry puts back those its Triton cache lacks (:func:`unpack`), each
written under a temporary name and renamed into place, as Triton itself does.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import torch

__all__ = ["cache_folder", "listing", "pack", "unpack"]


def cache_folder(device: torch.device) -> Path | None:
    """The folder Triton caches kernels for ``device`` in (``TRITON_CACHE_DIR``, else
    inductor's, as inductor sets it); None where no Triton kernels are made (CPU)."""
    if device.type != "cuda":
        return None
    from torch._inductor.runtime.runtime_utils import triton_cache_dir

    index = device.index if device.index is not None else torch.cuda.current_device()
    return Path(triton_cache_dir(index))


def listing(folder: Path | None) -> set[str]:
    """The kernel sub-folders of ``folder`` now."""
    if folder is None or not folder.is_dir():
        return set()
    return {entry.name for entry in os.scandir(folder) if entry.is_dir()}


def pack(folder: Path | None, before: set[str]) -> bytes:
    """A tar archive of the sub-folders of ``folder`` not in ``before`` (empty bytes if none)."""
    added = sorted(listing(folder) - before)
    if not added:
        return b""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in added:
            archive.add(folder / name, arcname=name)
    return buffer.getvalue()


def unpack(folder: Path | None, data: bytes) -> int:
    """Put the kernel sub-folders of the archive ``data`` that ``folder`` lacks into it;
    how many were put."""
    if folder is None or not data:
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    present = listing(folder)
    placed = 0
    with tarfile.open(fileobj=io.BytesIO(data)) as archive, \
            tempfile.TemporaryDirectory(dir=folder, prefix=".fastcalc-") as staging:
        archive.extractall(staging, filter="data")
        for entry in os.scandir(staging):
            if entry.name in present:
                continue
            try:
                os.rename(entry.path, folder / entry.name)
                placed += 1
            except OSError:  # another process put it there first
                shutil.rmtree(entry.path, ignore_errors=True)
    return placed
