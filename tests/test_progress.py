"""Progress is live on a terminal and a few whole lines in a log file."""

import io
import re
import sys
import time

from fastcalc.progress import LOG_INTERVAL_S, elapsed, interactive, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def stderr_into(stream: io.StringIO, monkeypatch) -> io.StringIO:
    """Standard error replaced by ``stream`` (in the test's body: pytest swaps standard
    error between a test's phases, fixtures' included)."""
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def test_a_file_is_not_interactive_and_a_terminal_is():
    assert not interactive(io.StringIO())
    assert interactive(Terminal())


def test_a_long_step_in_a_log_is_a_line_when_it_passes_the_delay_and_one_at_its_end(monkeypatch):
    log = stderr_into(io.StringIO(), monkeypatch)  # a batch job's log file
    with elapsed("fastcalc: compiling", delay=0.05):
        time.sleep(0.5)
    first, last = log.getvalue().splitlines()
    assert first == "fastcalc: compiling ..."
    assert re.fullmatch(r"fastcalc: compiling: took \d+ s", last)
    assert "\r" not in log.getvalue()


def test_a_step_shorter_than_the_delay_writes_nothing(monkeypatch):
    log = stderr_into(io.StringIO(), monkeypatch)  # a batch job's log file
    with elapsed("fastcalc: compiling", delay=5.0):
        pass
    assert log.getvalue() == ""


def test_a_long_step_on_a_terminal_is_a_line_redrawn_in_place(monkeypatch):
    terminal = stderr_into(Terminal(), monkeypatch)
    with elapsed("fastcalc: compiling", delay=0.05):
        time.sleep(0.5)
    assert "\rfastcalc: compiling: 00:0" in terminal.getvalue()


def test_a_bar_into_a_log_redraws_at_most_once_a_minute(monkeypatch):
    stderr_into(io.StringIO(), monkeypatch)
    with progress_bar(total=3) as bar:
        assert bar.mininterval == LOG_INTERVAL_S
    with progress_bar(total=3, file=Terminal()) as bar:
        assert bar.mininterval < 1
