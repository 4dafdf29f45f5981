"""The compiled kernels of one compilation, carried in a compile cache entry.

A model loaded from fastcalc's disk cache still needs the machine code of its kernels,
which its loaded code compiles again unless a compiler cache on this machine has them:

- on CUDA, Triton's kernels: inductor's and fastcalc's own
  (:mod:`fastcalc.uma.edge_kernels`, compiled at their first launch). Triton keeps them in
  its cache folder, one sub-folder per kernel (and per launcher module), named by a hash of
  everything that went into it. On the H200 a process whose Triton cache was empty spent
  6 s of a 10 s first call compiling them again (PET-S-shaped and UMA-S-shaped alike).
- on the CPU, inductor's C++ kernels, each built into a shared library (``*.so``, also the
  small ones that probe which vector instructions the compiler may use) in inductor's
  cache folder, named by a hash of its source and build command. On a 2-core CPU a
  process whose inductor cache was empty spent 37 s of a 39 s load of the PET-S-shaped
  model building them again (2026-12-05), and 2 s with them put back.

So an entry also holds the kernels that appeared in that folder since the process's first
compiled call of a stored graph, up to the first call of the entry's own
(:meth:`KernelFolder.listing` before, :meth:`KernelFolder.pack` after; the batched graph
compiled after the single one then carries the kernels they share), and a process that
loads the entry puts back those its folder lacks (:meth:`KernelFolder.unpack`), each
written under a temporary name and renamed into place, as Triton and inductor themselves
do. A kernel that was in the folder before (made by an earlier process) is not carried.

A Triton kernel folder holds every stage of its compilation (source, Triton, GPU and
LLVM IR, PTX), its metadata, the binary, and a group file naming them all by absolute
path: a cache hit reads the files its group names and launches only the binary. So only
the metadata and the binary are packed, and the group file names them alone; it is
written again with the paths where they land when the folder is put back, in another
node's cache folder or another process's ``TRITON_CACHE_DIR``. Paths into the first
process's folder would make Triton miss there and compile the kernel again.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["KernelFolder", "kernel_folder", "use_torchs_ptxas"]


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


#: Compilation stages a Triton kernel folder keeps that a cache hit does not load.
_STAGES = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn")
_GROUP = "__grp__"
#: Prefix of the folders :meth:`KernelFolder.unpack` stages kernels in (not kernels).
_STAGING = ".fastcalc-"


@dataclass(frozen=True)
class KernelFolder:
    """A compiler's cache folder of kernels: Triton's (``triton``: one sub-folder per
    kernel) or inductor's (its C++ kernels' shared libraries, ``*/*.so``)."""

    path: Path
    triton: bool

    def listing(self) -> set[str]:
        """The kernels in the folder now, by path relative to it."""
        if not self.path.is_dir():
            return set()
        if self.triton:
            return {entry.name for entry in os.scandir(self.path)
                    if entry.is_dir() and not entry.name.startswith(_STAGING)}
        return {path.relative_to(self.path).as_posix() for path in self.path.glob("*/*.so")}

    def pack(self, before: set[str]) -> bytes:
        """A tar archive of the kernels in the folder not in ``before`` (empty bytes if
        none); of a Triton kernel folder without the compilation stages a cache hit does
        not load, its group files naming the files kept (by name; :meth:`unpack` makes
        the paths)."""
        added = sorted(self.listing() - before)
        if not added:
            return b""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for name in added:
                if not self.triton:
                    archive.add(self.path / name, arcname=name)
                    continue
                for path in sorted((self.path / name).iterdir()):
                    if path.name.startswith(_GROUP):
                        _add_bytes(archive, f"{name}/{path.name}", _group_names(path))
                    elif path.suffix not in _STAGES:
                        archive.add(path, arcname=f"{name}/{path.name}")
        return buffer.getvalue()

    def unpack(self, data: bytes) -> int:
        """Put the kernels of the archive ``data`` that the folder lacks into it (Triton's
        group files naming where their files now lie); how many were put."""
        if not data:
            return 0
        self.path.mkdir(parents=True, exist_ok=True)
        present = self.listing()
        placed = 0
        with tarfile.open(fileobj=io.BytesIO(data)) as archive, \
                tempfile.TemporaryDirectory(dir=self.path, prefix=_STAGING) as staging:
            archive.extractall(staging, filter="data")
            for name in sorted(KernelFolder(Path(staging), self.triton).listing() - present):
                staged, final = Path(staging) / name, self.path / name
                if self.triton:
                    _place_groups(staged, final)
                final.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.rename(staged, final)
                    placed += 1
                except OSError:  # another process put it there first
                    shutil.rmtree(staged, ignore_errors=True)
        return placed


def kernel_folder(device: torch.device) -> KernelFolder:
    """Where the kernels compiled for ``device`` are cached: Triton's folder for CUDA
    (``TRITON_CACHE_DIR``, else inductor's, as inductor sets it), inductor's for the CPU."""
    if device.type == "cuda":
        from torch._inductor.runtime.runtime_utils import triton_cache_dir

        index = device.index if device.index is not None else torch.cuda.current_device()
        return KernelFolder(Path(triton_cache_dir(index)), triton=True)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return KernelFolder(Path(cache_dir()), triton=False)


def _group_names(path: Path) -> bytes:
    """The group file ``path`` naming its kept files by name instead of by path."""
    children = json.loads(path.read_text())["child_paths"]
    kept = sorted(child for child in children if Path(child).suffix not in _STAGES)
    return json.dumps({"child_paths": {child: child for child in kept}}).encode()


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def _place_groups(staged: Path, final: Path) -> None:
    """Rewrite the group files in ``staged`` to name their files in ``final``."""
    for path in staged.glob(f"{_GROUP}*"):
        children = json.loads(path.read_text())["child_paths"]
        path.write_text(json.dumps(
            {"child_paths": {child: str(final / child) for child in children}}))
