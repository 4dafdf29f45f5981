"""A per-user disk cache of compiled models, so that the next process runs them at once.

The first process that compiles a model's function stores it compiled ahead of time
(:class:`fastcalc.saved_graph.SavedGraph`: the traced graph's code, the model tensors it
reads, and torch's ``aot_compile`` artifact of dynamo's and inductor's output), together
with torch's compile artifacts of that compilation (``torch.compiler.save_cache_artifacts``:
inductor's code and its compiled kernels) and the kernels' machine code its compilation
and first call made (:mod:`fastcalc.kernel_bundle`: Triton's on CUDA, inductor's C++
libraries on the CPU). A later process on a machine with the same software and device
loads both and calls the compiled code without tracing, compiling or building kernels.
This works across machines that share the folder (a job array over nodes), where
torch's own caches in ``/tmp`` do not.

Entries are named by a :class:`CacheKey`: the model's content (a digest of its weights
and hyper-parameters, not its file name), fastcalc's, torch's and triton's versions, a
digest of fastcalc's own source (so that code changed under one version number, as in a
development install, compiles afresh), the device, and the dtype, precision and compile
mode. An entry is written to a temporary file and renamed into place, so two processes
filling it at once both succeed and no reader sees half a file; an entry that cannot be
read or does not match its key is reported in one warning, removed and written again.

The folder is ``$FASTCALC_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastcalc``, else
``~/.cache/fastcalc``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import platform
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .kernel_bundle import KernelFolder
from .saved_graph import LoadedGraph, SavedGraph

try:
    import fcntl
except ImportError:  # Windows: nothing is locked (two builders of one entry both succeed)
    fcntl = None

__all__ = [
    "CACHE_ENV", "CacheKey", "CompileCache", "StoredEntry", "default_cache_dir", "held", "locked",
    "tensors_digest", "try_lock",
]

#: Environment variable naming the cache folder.
CACHE_ENV = "FASTCALC_CACHE_DIR"
_SUFFIX = ".fastcalc-compiled"
_LOCK = ".lock"
#: The subfolder of models converted from their files (:mod:`fastcalc.converted`).
CONVERTED = "converted"
_MAGIC = b"fastcalc-compiled-2\n"
_log = logging.getLogger("fastcalc")


def default_cache_dir() -> Path:
    """``$FASTCALC_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastcalc``, else ``~/.cache/fastcalc``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "fastcalc"


def tensors_digest(tensors: Mapping[str, torch.Tensor], extra: object = None) -> str:
    """SHA-256 of named tensors (names, dtypes, shapes and values) and ``repr(extra)``
    (hyper-parameters): the content of a model, whatever file it came from. Each tensor
    is hashed on its own in a thread pool (hashlib releases the GIL), since a UMA-S
    checkpoint's weights take most of a second to hash in one thread."""
    names = sorted(tensors)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        values = pool.map(_tensor_sha256, (tensors[name] for name in names))
        digest = hashlib.sha256(repr(extra).encode())
        for name, value in zip(names, values, strict=True):
            tensor = tensors[name]
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode() + value)
    return digest.hexdigest()


def _tensor_sha256(tensor: torch.Tensor) -> bytes:
    """SHA-256 of a tensor's values (its bytes in C order), without a host copy of them."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data).digest()


def _device_name(device: torch.device) -> str:
    """The device as compiled code depends on it: a GPU's name and architecture, or the
    CPU's architecture and the vector instructions its kernels are generated for."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"
    return f"{device.type} {platform.machine()} {torch.backends.cpu.get_cpu_capability()}"


@functools.cache
def source_digest(package: Path = Path(__file__).parent) -> str:
    """A digest of the Python source files of ``package`` (by default fastcalc's own: what
    its compiled graphs are made of)."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "none"
    return triton.__version__


@dataclass(frozen=True)
class CacheKey:
    """What a compiled model depends on; entries are named by its digest."""

    model: str  # tensors_digest of the model
    fastcalc: str
    source: str  # source_digest(): fastcalc's code
    torch: str
    triton: str
    device: str
    dtype: str
    precision: str
    compile_mode: str
    graph: str  # which of the model's functions: "single" or "batch"

    @classmethod
    def create(
        cls,
        model: str,
        device: torch.device,
        dtype: torch.dtype,
        precision: str,
        mode: str,
        graph: str = "single",
    ) -> CacheKey:
        """The key of ``model``'s function ``graph`` (a digest) compiled here for ``device``
        in ``dtype``."""
        from . import __version__

        return cls(
            model=model,
            fastcalc=__version__,
            source=source_digest(),
            torch=torch.__version__,
            triton=_triton_version(),
            device=_device_name(device),
            dtype=str(dtype).removeprefix("torch."),
            precision=precision,
            compile_mode=mode,
            graph=graph,
        )

    @property
    def name(self) -> str:
        """The entry's file name: a digest of every field."""
        fields = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(fields).hexdigest()[:32] + _SUFFIX


@dataclass(frozen=True)
class StoredEntry:
    """An entry read and checked (:meth:`CompileCache.read`), not yet bound to a model."""

    path: Path
    saved: SavedGraph
    artifacts: bytes


@dataclass(frozen=True)
class CacheEntry:
    """One stored compilation: its file, key, size in bytes and modification time."""

    path: Path
    key: dict
    size: int
    modified: float


class EntryReading:
    """An entry at ``path`` being read in a thread of its own by ``check`` (which ends in
    :meth:`CompileCache.checked`). Its outcome is taken in the caller's thread
    (:meth:`result`), where an unusable entry is reported and removed, as
    :meth:`CompileCache.read` does."""

    def __init__(self, check: Callable[[], StoredEntry], path: Path) -> None:
        self._path = path
        self._outcome: StoredEntry | Exception | None = None
        self._thread = threading.Thread(target=self._run, args=(check,),
                                        name="fastcalc-read-entry")
        self._thread.start()

    def _run(self, check: Callable[[], StoredEntry]) -> None:
        try:
            self._outcome = check()
        except Exception as error:  # any damage: reported by result()
            self._outcome = error

    def done(self) -> bool:
        """Whether the reading is over."""
        return not self._thread.is_alive()

    def wait(self) -> None:
        """Return once the reading is over."""
        self._thread.join()

    def result(self) -> StoredEntry | None:
        """The entry read, once the reading is over; None if it is unusable (reported in
        one warning and removed)."""
        self._thread.join()
        if isinstance(self._outcome, Exception):
            _unusable(self._path, self._outcome)
            return None
        return self._outcome


class CompileCache:
    """The folder of stored compilations (see the module docstring)."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = default_cache_dir() if folder is None else Path(folder).expanduser()

    def path(self, key: CacheKey) -> Path:
        """Where the entry of ``key`` lives."""
        return self.folder / key.name

    def lock_path(self, key: CacheKey) -> Path:
        """The lock a process holds while it builds the entry of ``key``
        (:mod:`fastcalc.background_build`)."""
        return self.folder / (key.name + _LOCK)

    def building(self) -> list[str]:
        """The entry names that a process is building now (holding their lock)."""
        return sorted(path.name.removesuffix(_LOCK)
                      for path in self.folder.glob(f"*{_SUFFIX}{_LOCK}") if held(path))

    def read(self, key: CacheKey, kernels: KernelFolder | None = None) -> StoredEntry | None:
        """The entry of ``key``, checked, with its compiled kernels put into the compiler's
        cache folder ``kernels`` where missing; None if there is none. An unusable entry is
        reported in one warning and removed."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            return self.checked(key, kernels)
        except Exception as error:  # any damage: report, drop, compile again
            _unusable(path, error)
            return None

    def checked(self, key: CacheKey, kernels: KernelFolder | None = None) -> StoredEntry:
        """The entry of ``key`` read and checked, its kernels put into ``kernels``; raises
        if it is damaged (:meth:`read` and :class:`EntryReading` report that)."""
        path = self.path(key)
        start = time.perf_counter()
        stored_key, saved, artifacts, machine_code = _read(path)
        if stored_key != asdict(key):
            raise ValueError("its key does not match")
        if kernels is not None:
            kernels.unpack(machine_code)
        _log.info("fastcalc: reading the stored model and its kernels took %.1f s",
                  time.perf_counter() - start)
        return StoredEntry(path, saved, artifacts)

    def bind(self, entry: StoredEntry, owner: nn.Module | None) -> LoadedGraph | None:
        """The compiled code of ``entry`` (after torch's compile artifacts) bound to the
        tensors of ``owner`` (the model); None, with the entry reported in one warning and
        removed, if it is unusable."""
        moments = [time.perf_counter()]
        try:
            if entry.artifacts:
                torch.compiler.load_cache_artifacts(entry.artifacts)
            moments.append(time.perf_counter())
            loaded = LoadedGraph.load(entry.saved, owner)
        except Exception as error:
            _unusable(entry.path, error)
            return None
        moments.append(time.perf_counter())
        _log.info(
            "fastcalc: binding the stored model took %.1f s: torch's compile artifacts %.1f s, "
            "the compiled code %.1f s (with the imports of dynamo and inductor not made before)",
            moments[-1] - moments[0], *(b - a for a, b in itertools.pairwise(moments)),
        )
        return loaded

    def load(
        self, key: CacheKey, owner: nn.Module | None, kernels: KernelFolder | None = None
    ) -> LoadedGraph | None:
        """:meth:`read` then :meth:`bind`: the stored graph of ``key`` bound to the tensors of
        ``owner``, or None if there is none or it is unusable (reported and removed)."""
        entry = self.read(key, kernels)
        return None if entry is None else self.bind(entry, owner)

    def store(self, key: CacheKey, saved: SavedGraph, kernels: bytes = b"") -> Path | None:
        """Write ``saved``, what torch compiled in this process and ``kernels`` (their
        machine code, :meth:`fastcalc.kernel_bundle.KernelFolder.pack`) as the entry of
        ``key`` (atomically: a temporary file renamed into place); None when the folder
        cannot be written (reported in one warning: the model runs regardless)."""
        artifacts = torch.compiler.save_cache_artifacts()
        artifacts = artifacts[0] if artifacts is not None else b""
        payload = saved.compiled + artifacts + kernels
        header = json.dumps({
            "key": asdict(key),
            "sha256": hashlib.sha256(saved.source.encode() + payload).hexdigest(),
            "source": saved.source,
            "attributes": saved.attributes,
            "compiled_bytes": len(saved.compiled),
            "artifacts_bytes": len(artifacts),
        }).encode()
        data = _MAGIC + header + b"\n" + payload
        if not write_atomically(self.path(key), data, "the compiled model"):
            return None
        return self.path(key)

    def converted(self) -> list[Path]:
        """The models stored as converted from their files (:mod:`fastcalc.converted`)."""
        return sorted(p for p in (self.folder / CONVERTED).glob("*") if p.suffix != ".tmp")

    def entries(self) -> list[CacheEntry]:
        """The stored compilations, newest first (unreadable ones with an empty key)."""
        found = []
        for path in self.folder.glob(f"*{_SUFFIX}"):
            try:
                key = _read(path)[0]
            except Exception:
                key = {}
            stat = path.stat()
            found.append(CacheEntry(path, key, stat.st_size, stat.st_mtime))
        return sorted(found, key=lambda entry: entry.modified, reverse=True)

    def clear(self, entries: Iterable[CacheEntry] | None = None) -> int:
        """Remove ``entries`` (default: all, the converted models and stale temporary
        files); how many went."""
        paths = [entry.path for entry in (self.entries() if entries is None else entries)]
        if entries is None:  # and temporary files of writers that died an hour ago or more
            paths += self.converted()
            paths += [p for folder in (self.folder, self.folder / CONVERTED)
                      for p in folder.glob("*.tmp") if time.time() - p.stat().st_mtime > 3600]
        for path in paths:
            path.unlink(missing_ok=True)
        if entries is None:  # the locks of builds that are over
            for path in self.folder.glob(f"*{_SUFFIX}{_LOCK}"):
                with locked(path, wait=False) as free:
                    if free:
                        path.unlink(missing_ok=True)
        return len(paths)


def try_lock(file: IO, wait: bool = False) -> bool:
    """Take an exclusive lock on the open ``file``, released when every descriptor of it
    is closed (a process that inherited it keeps it; a process that dies releases it);
    without ``wait``, False at once when another holds it. True where there are no locks
    (no ``fcntl``, or a file system that refuses them)."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(file, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK and the like: go on unlocked, as without fcntl
        return True
    return True


@contextlib.contextmanager
def locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on the file ``path`` (created if missing) inside the block
    (:func:`try_lock`); without ``wait``, yield False at once when another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as file:
        yield try_lock(file, wait)


def held(path: Path) -> bool:
    """Whether another holds the lock on ``path`` (see :func:`locked`) now; False if there
    is no such file or it cannot be read. Creates nothing (a read-only folder is fine)."""
    try:
        with open(path) as file:
            return not try_lock(file)
    except OSError:
        return False


def write_atomically(path: Path, data: bytes, what: str) -> bool:
    """Write ``data`` (``what``, for the warning) to ``path`` through a temporary file
    renamed into place, so that no reader sees half of it; False, after one warning, when
    the folder cannot be written (the model runs regardless)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(file.name, path)
    except OSError as error:
        warnings.warn(
            f"fastcalc: cannot store {what} in {path.parent} ({error}); set "
            f"{CACHE_ENV} or cache_dir= to a writable folder, or cache_dir=False",
            UserWarning,
            stacklevel=3,
        )
        return False
    return True


def _unusable(path: Path, error: Exception) -> None:
    """Report the entry at ``path`` as unusable in one warning and remove it."""
    warnings.warn(
        f"fastcalc: compile cache entry {path} is unusable ({error}); compiling again and "
        "replacing it",
        UserWarning,
        stacklevel=3,
    )
    path.unlink(missing_ok=True)


def _read(path: Path) -> tuple[dict, SavedGraph, bytes, bytes]:
    """The key, saved graph, torch compile artifacts and kernels' machine code of an entry
    file; ValueError if it is damaged."""
    data = path.read_bytes()
    if not data.startswith(_MAGIC):
        raise ValueError("not a fastcalc compile cache file")
    header, _, payload = data[len(_MAGIC):].partition(b"\n")
    meta = json.loads(header)
    if hashlib.sha256(meta["source"].encode() + payload).hexdigest() != meta["sha256"]:
        raise ValueError("its contents do not match their checksum")
    size, artifacts = meta["compiled_bytes"], meta["artifacts_bytes"]
    saved = SavedGraph(meta["source"], meta["attributes"], payload[:size])
    return meta["key"], saved, payload[size:size + artifacts], payload[size + artifacts:]
