"""What a model file holds, read without loading it: zip members and the root pickle's
classes and strings (``pickletools`` lists a pickle's opcodes without running them).

``torch.save`` writes a zip archive whose ``<name>/data.pkl`` pickles the saved
object; a TorchScript archive (``torch.jit.save``) also holds compiled ``code/``.
"""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path

__all__ = ["archive_members", "pickle_globals", "pickle_strings"]


def archive_members(path: Path) -> list[str]:
    """The member names of the zip archive at ``path``; none if it is not a zip archive."""
    if not zipfile.is_zipfile(path):
        return []
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


def _root_pickle(path: Path) -> bytes:
    """The archive's top-level ``<name>/data.pkl``, or nothing."""
    roots = [name for name in archive_members(path) if name.count("/") == 1
             and name.endswith("/data.pkl")]
    if len(roots) != 1:
        return b""
    with zipfile.ZipFile(path) as archive:
        return archive.read(roots[0])


def _opcodes(path: Path) -> list[tuple[str, object]]:
    """(opcode name, argument) of the root pickle; none for an unreadable one."""
    try:
        return [(op.name, arg) for op, arg, _ in pickletools.genops(_root_pickle(path))]
    except ValueError:  # truncated or not a pickle
        return []


def pickle_globals(path: Path) -> set[str]:
    """The ``"module name"`` of every class or function the root pickle refers to
    (``torch.save`` writes protocol 2, where each is one ``GLOBAL`` opcode)."""
    return {str(arg) for name, arg in _opcodes(path) if name == "GLOBAL"}


def pickle_strings(path: Path) -> list[str]:
    """The root pickle's strings, in order (each once: a repeat is a memo reference)."""
    return [arg for name, arg in _opcodes(path) if isinstance(arg, str) and "UNICODE" in name]
