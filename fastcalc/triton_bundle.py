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

A kernel folder holds every stage of its compilation (source, Triton, GPU and LLVM IR,
PTX), its metadata, the binary, and a group file naming them all by absolute path: a
cache hit reads the files its group names and launches only the binary. So only the
metadata and the binary are packed, and the group file names them alone; it is written
again with the paths where they land when the folder is put back, in another node's
cache folder or another process's ``TRITON_CACHE_DIR``. Paths into the first process's
folder would make Triton miss there and compile the kernel again.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import torch

__all__ = ["cache_folder", "listing", "pack", "unpack", "use_torchs_ptxas"]


def use_torchs_ptxas() -> None:
    """Name torch's ptxas in ``TRITON_PTXAS_PATH`` where torch ships one and the variable
    is unset, as inductor does in the processes that compile its kernels.

    Triton's cache key of a kernel holds the version of the ptxas it uses, and Triton
    reads that version once per process. A process that compiled UMA read it before
    inductor named torch's ptxas (Triton's own, CUDA 12.8, on the H200), one that loaded
    UMA from the disk cache after (torch's, CUDA 13.0): the loading process then looked
    for fastcalc's four edge kernels under other keys than the entry carried them, and
    compiled them again (H200, torch 2.11, 2026-12-03). Called when fastcalc is imported,
    so that every process of fastcalc's reads the same version."""
    ptxas = Path(torch.__file__).parent / "bin" / "ptxas"
    if "TRITON_PTXAS_PATH" not in os.environ and os.access(ptxas, os.X_OK):
        os.environ["TRITON_PTXAS_PATH"] = str(ptxas)


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


#: Compilation stages a kernel folder keeps that a cache hit does not load.
_STAGES = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn")
_GROUP = "__grp__"


def pack(folder: Path | None, before: set[str]) -> bytes:
    """A tar archive of the sub-folders of ``folder`` not in ``before`` (empty bytes if
    none), without the compilation stages a cache hit does not load, their group files
    naming the files kept (by name; :func:`unpack` makes the paths)."""
    added = sorted(listing(folder) - before)
    if not added:
        return b""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in added:
            for path in sorted((folder / name).iterdir()):
                if path.name.startswith(_GROUP):
                    _add_bytes(archive, f"{name}/{path.name}", _group_names(path))
                elif path.suffix not in _STAGES:
                    archive.add(path, arcname=f"{name}/{path.name}")
    return buffer.getvalue()


def _group_names(path: Path) -> bytes:
    """The group file ``path`` naming its kept files by name instead of by path."""
    children = json.loads(path.read_text())["child_paths"]
    kept = sorted(child for child in children if Path(child).suffix not in _STAGES)
    return json.dumps({"child_paths": {child: child for child in kept}}).encode()


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def unpack(folder: Path | None, data: bytes) -> int:
    """Put the kernel sub-folders of the archive ``data`` that ``folder`` lacks into it,
    their group files naming where their files now lie; how many were put."""
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
            _place_groups(Path(entry.path), folder / entry.name)
            try:
                os.rename(entry.path, folder / entry.name)
                placed += 1
            except OSError:  # another process put it there first
                shutil.rmtree(entry.path, ignore_errors=True)
    return placed


def _place_groups(staged: Path, final: Path) -> None:
    """Rewrite the group files in ``staged`` to name their files in ``final``."""
    for path in staged.glob(f"{_GROUP}*"):
        children = json.loads(path.read_text())["child_paths"]
        path.write_text(json.dumps(
            {"child_paths": {child: str(final / child) for child in children}}))
