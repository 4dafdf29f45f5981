"""Progress shown to suit where it goes: live on a terminal or in a notebook, and in a log
file (a batch job's standard error) as a few whole lines.

tqdm redraws its line with a carriage return up to ten times a second, which a terminal
shows in place but a log file keeps: a ten-minute MD run left thousands of updates on one
line of its job's log. Where standard error is not :func:`interactive`, bars redraw at
most once a minute (:data:`LOG_INTERVAL_S`) and :func:`elapsed` writes one line when a
long step passes its delay and one when it ends.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from tqdm.auto import tqdm

__all__ = ["LOG_INTERVAL_S", "elapsed", "interactive", "progress_bar"]

#: Least seconds between two redraws of a bar whose output is not interactive.
LOG_INTERVAL_S = 60.0


def interactive(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: standard error) shows a redrawn line in place: a
    terminal, or the output stream of a Jupyter (IPython) kernel."""
    stream = sys.stderr if stream is None else stream
    if type(stream).__module__.startswith("ipykernel"):
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(**options: Any) -> tqdm:
    """``tqdm(**options)``, redrawn at most every :data:`LOG_INTERVAL_S` seconds when its
    output is not :func:`interactive`."""
    if not interactive(options.get("file")):
        options.setdefault("mininterval", LOG_INTERVAL_S)
    return tqdm(**options)


@contextmanager
def elapsed(description: str, delay: float = 3.0) -> Iterator[None]:
    """Show that a long step is running once it has taken ``delay`` seconds (a silent
    minute looks like a hang): on an interactive stream, a line counting the seconds,
    removed at the end; elsewhere, a line then and a line with its duration at the end."""
    done = threading.Event()
    live = interactive()
    start = time.perf_counter()
    shown = threading.Event()

    def show() -> None:
        if done.wait(delay):
            return
        if not live:
            print(f"{description} ...", file=sys.stderr, flush=True)
            shown.set()
            return
        with tqdm(desc=description, bar_format="{desc}: {elapsed}", leave=False) as line:
            while not done.wait(1.0):
                line.refresh()

    thread = threading.Thread(target=show, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if shown.is_set():
            seconds = time.perf_counter() - start
            print(f"{description}: took {seconds:.0f} s", file=sys.stderr, flush=True)
