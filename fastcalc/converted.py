"""Models converted from their upstream files, kept in the disk cache by file identity.

Reading a model file through its upstream library can cost a warm start more than the
model's arithmetic: a PET ``.pt`` export is opened by metatomic, whose import compiles
metatensor-operations' TorchScript functions (most of the 1.8 s that building a
PET-S-shaped calculator took on a 2-core CPU; 1.0 s on the H200). The first process that
converts a file stores the result (weights and metadata, no code) next to the compiled
models; a later process that finds the same file (same resolved path, size, modification
time and inode) reads that instead. A file changed in any of those is read afresh, and
so is any file under a new fastcalc or torch (the conversion's code and the storage
format may differ); the new conversion replaces the file's older one. An entry that
cannot be read is reported in one warning, converted again and replaced; entries are
written atomically."""

from __future__ import annotations

import hashlib
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from .compile_cache import CONVERTED, source_digest, write_atomically

__all__ = ["converted", "entry_name"]

Model = TypeVar("Model")
_log = logging.getLogger("fastcalc")


def entry_name(path: Path, kind: str) -> str:
    """The file name of ``path``'s conversion: a digest of the resolved path, then one of
    what makes the conversion reusable (the file's size, modification time and inode,
    fastcalc's source and torch's version), then ``kind``."""
    path = path.resolve()
    stat = path.stat()
    state = (stat.st_size, stat.st_mtime_ns, stat.st_ino, source_digest(), torch.__version__)
    return f"{_digest(str(path))}.{_digest(repr(state))}.{kind}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def converted(
    path: Path,
    folder: Path | None,
    read: Callable[[Path], Model],
    pack: Callable[[Model], bytes],
    unpack: Callable[[bytes], Model],
    kind: str,
) -> Model:
    """``read(path)``, or its stored conversion from ``folder`` (the cache folder; None:
    no storing); ``pack`` and ``unpack`` turn the model into bytes and back, ``kind``
    names the format in the entry's file name."""
    if folder is None:
        return read(path)
    start = time.perf_counter()
    entry = folder / CONVERTED / entry_name(path, kind)
    if entry.exists():
        try:
            model = unpack(entry.read_bytes())
            _log.info("fastcalc: %s read from its stored conversion %s in %.1f s", path, entry,
                      time.perf_counter() - start)
            return model
        except Exception as error:  # any damage: report, read the file, replace the entry
            warnings.warn(
                f"fastcalc: converted model {entry} is unusable ({error}); reading {path} "
                "again and replacing it",
                UserWarning,
                stacklevel=3,
            )
            entry.unlink(missing_ok=True)
    model = read(path)
    if write_atomically(entry, pack(model), "the converted model"):
        same_file = entry.name.split(".")[0]
        for older in entry.parent.glob(f"{same_file}.*.{kind}"):  # the file before it changed
            if older != entry:
                older.unlink(missing_ok=True)
    _log.info("fastcalc: %s read and its conversion stored in %.1f s", path,
              time.perf_counter() - start)
    return model
