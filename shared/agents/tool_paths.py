"""Confining a file a tool's arguments name to the folder the tool may read.

A model's arguments are untrusted (a document it read may have told it what to write): a tool that opens
`path` from its arguments resolves it here first, so `../`, an absolute path or a symlink out of the folder
is refused as a tool error the model reads, and nothing outside the folder is touched.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

from stepq.errors import ToolArgumentError

__all__ = ["confined_path"]


def confined_path(root: str | PathLike[str], candidate: str | PathLike[str]) -> Path:
    """`candidate` resolved inside `root` (symlinks followed), or ToolArgumentError naming the refusal."""
    base = Path(root).resolve()
    text = str(candidate)
    if "\x00" in text:
        raise ToolArgumentError("path contains a NUL byte")
    resolved = (base / text).resolve()
    if not resolved.is_relative_to(base):
        raise ToolArgumentError(f"path {text!r} is outside the folder this tool may read")
    return resolved
