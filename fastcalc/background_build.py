"""Compiling a model in a process of its own while the calculator answers uncompiled.

Without an entry in the disk cache, a calculator's first compiled call would wait for
tracing and compiling: a minute or more on a GPU, for a notebook user's first number or
a short script's only one. Instead, :meth:`BackgroundBuild.start` writes the model's
function, its tensors and the call's inputs to a temporary folder and starts ``python -m
fastcalc.background_build FOLDER ENTRY PID``. That process compiles the function, runs it
once and stores the entry, as a first process does (:class:`fastcalc.tracing.GraphRunner`),
while the calculator runs the same function eagerly; its first call after the process is
done loads the entry.

The building process holds the entry's lock
(:meth:`fastcalc.compile_cache.CompileCache.lock_path`, inherited from the calculator's
process, so no other process can take it in between) from its start to its end. Other
processes on the machine that need the same entry (a job array, parallel workers) wait
for it instead of compiling it again, and a process that dies releases it. It runs in a
session of its own and finishes storing the entry when the calculator's process ends (or
is interrupted) first, so that the next process starts compiled. Where ``fcntl`` is
missing (Windows), nothing is locked: processes may compile the same entry at once,
which the disk cache allows.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from .compile_cache import CacheKey, CompileCache, fcntl, held, locked, try_lock

__all__ = ["BackgroundBuild", "build"]

_log = logging.getLogger("fastcalc")
#: Seconds between two looks at another process's build (a stat and a lock attempt).
POLL_INTERVAL = 0.5
_PAYLOAD = "payload.pt"
_LOG = "log.txt"


def _module_of(fn: Callable) -> str | None:
    """The module another process imports to find ``fn`` (a function, a bound method or a
    callable object)."""
    return getattr(getattr(fn, "__func__", fn), "__module__", None)


def _payload(
    cache: CompileCache, key: CacheKey, fn: Callable, owner: nn.Module | None,
    inputs: Sequence[torch.Tensor],
) -> Path | None:
    """A new temporary folder holding what the building process needs; None (and no
    folder) when ``fn`` cannot be imported or pickled by another process."""
    if _module_of(fn) in (None, "__main__"):
        return None
    folder = Path(tempfile.mkdtemp(prefix="fastcalc-build-"))
    payload = {"fn": fn, "owner": owner, "inputs": [t.detach() for t in inputs],
               "cache": str(cache.folder), "key": key}
    try:
        torch.save(payload, folder / _PAYLOAD)
    except Exception as error:  # a closure or a lambda does not pickle
        _log.info("fastcalc: the model cannot be compiled in another process (%r)", error)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return folder


def _environment() -> dict[str, str]:
    """This process's environment, with its import path (fastcalc's folder first), so that
    the building process imports the modules this one does."""
    paths = [str(Path(__file__).resolve().parent.parent), *(path for path in sys.path if path)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


class BackgroundBuild:
    """The build of one cache entry by another process: this process's own
    (``process``), or, when another process held the entry's lock first, that one's."""

    def __init__(self, cache: CompileCache, key: CacheKey, process: subprocess.Popen | None,
                 folder: Path | None) -> None:
        self.cache = cache
        self.key = key
        self.process = process
        self.folder = folder
        self.started = time.perf_counter()
        self.failure: str | None = None
        self._finished = False
        self._looked = 0.0

    @classmethod
    def start(
        cls, cache: CompileCache, key: CacheKey, fn: Callable, owner: nn.Module | None,
        inputs: Sequence[torch.Tensor],
    ) -> BackgroundBuild | None:
        """Start building the entry of ``key`` from ``fn`` (reading no tensors but its
        inputs and those of ``owner``) called on ``inputs``; wait for the process that
        builds it already, if one does. None when ``fn`` cannot go to another process (a
        function of the ``__main__`` script, a closure) or the cache folder cannot be
        written: compile in this one."""
        lock = cache.lock_path(key)
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            file = open(lock, "a")  # closed below, once the building process has it
        except OSError:  # a folder that cannot be written: compile here, as without a cache
            return None
        with file:  # the building process inherits the lock
            if not try_lock(file):
                _log.info("fastcalc: another process is compiling the model; calls run "
                          "uncompiled until it has stored it in %s", cache.folder)
                return cls(cache, key, None, None)
            folder = _payload(cache, key, fn, owner, inputs)
            if folder is None:
                return None
            descriptor = [file.fileno()] if fcntl is not None else []
            try:
                with open(folder / _LOG, "w") as log:
                    process = subprocess.Popen(
                        [sys.executable, "-m", "fastcalc.background_build", str(folder),
                         str(cache.path(key)), str(os.getpid())],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        env=_environment(), pass_fds=descriptor,
                        start_new_session=True,  # a Ctrl-C for the calculator's process spares it
                    )
            except OSError as error:
                _log.info("fastcalc: no process could be started to compile the model (%r)",
                          error)
                shutil.rmtree(folder, ignore_errors=True)
                return None
        print(f"fastcalc: compiling the model in process {process.pid}, for this process and "
              f"later ones (stored in {cache.folder}); until it is done, calls run uncompiled",
              file=sys.stderr, flush=True)
        return cls(cache, key, process, folder)

    def done(self) -> bool:
        """Whether the build has ended (see :attr:`failure` for how); cheap to ask often."""
        if self._finished:
            return True
        if self.process is not None:
            code = self.process.poll()
            if code is None:
                return False
            if code != 0:
                self.failure = f"process {self.process.pid} exited with {code}: {self._tail()}"
            self._end()
            return True
        now = time.perf_counter()  # another process's build: look now and then
        if now - self._looked < POLL_INTERVAL:
            return False
        self._looked = now
        if self.cache.path(self.key).exists():
            self._end()
            return True
        if held(self.cache.lock_path(self.key)):
            return False
        self.failure = "the process that was compiling it ended without storing it"
        self._end()
        return True

    def wait(self) -> None:
        """Block until the build has ended."""
        if self.process is not None:
            self.process.wait()
        else:
            with locked(self.cache.lock_path(self.key)):
                pass
            self._looked = 0.0  # look now
        self.done()

    def _tail(self) -> str:
        try:
            lines = (self.folder / _LOG).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no output"
        return lines[-1] if lines else "no output"

    def _end(self) -> None:
        self._finished = True
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def build(folder: Path, entry: Path, parent: int) -> None:
    """The building process (holding the entry's lock, inherited from the calculator's
    process ``parent``): compile, run and store the payload of ``folder`` as ``entry``,
    unless it is there already; then remove ``folder``. A failure leaves ``folder``'s
    log for the calculator to report, unless its process has ended."""
    from .tracing import GraphRunner

    try:
        if not entry.exists():
            payload = torch.load(folder / _PAYLOAD, weights_only=False)
            (folder / _PAYLOAD).unlink()  # the model's weights: not left behind on a failure
            key = payload["key"]
            runner = GraphRunner(payload["fn"], "default", CompileCache(payload["cache"]),
                                 lambda: key, payload["owner"])
            runner(*payload["inputs"])
            if not entry.exists():
                raise SystemExit("the compiled model could not be stored (see the warnings above)")
    except BaseException:
        if os.getppid() != parent:  # the calculator's process is gone: nobody reads the log
            shutil.rmtree(folder, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    logging.basicConfig(format="%(message)s")
    _log.setLevel(logging.INFO)
    build(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
