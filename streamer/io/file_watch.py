"""A file the model reads, watched while the model runs: one stat per layer call.

A file overwritten in place while the model streams from it (a download's shard fetched again, a
repacked expert file rewritten, same size, other bytes) changes what the experts compute, and
nothing else would say so: the mapped path sees the new page-cache bytes, the slot path reads
them. Every layer call therefore stats its files by name and compares what it finds with what the
open descriptor was at load (device, inode, size, modification time): a change is noticed at the
next layer call that reads the file, within the token it happened in, and generation stops with
one line naming the file. A stat is a few microseconds, a layer call milliseconds.

A write that keeps the size and restores the time (`touch -r`) is not seen here; `--verify-reads`
checks each expert's crc32 as its bytes come from disk.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


class FileWatch:
    """What a file was when it was opened, to tell whether the name still holds those bytes."""

    def __init__(self, path: Path, fd: int):
        self.path = Path(path)
        self._name = os.fspath(path)  # stat by str: a Path converts itself on every call
        self._was = _identity(os.fstat(fd))

    def change(self) -> str | None:
        """How the file at `path` differs from the one opened, in words; None if it does not."""
        try:
            now = _identity(os.stat(self._name))
        except OSError as e:
            return f"was removed or renamed ({e.strerror or e})"
        if now[:2] != self._was[:2]:
            return "was replaced by another file"
        if now[2] != self._was[2]:
            return f"changed size ({self._was[2]} bytes, now {now[2]})"
        if now[3] != self._was[3]:
            return "was written to (its modification time moved)"
        return None


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def watch_files(paths: Sequence[Path], fds: Sequence[int]) -> list[tuple[int, FileWatch]]:
    """(file number, watch) for each distinct file of `paths` (a layer's files, a path listed
    once per tensor it holds), opened as `fds` in the same order."""
    first: dict[Path, int] = {}
    for file, path in enumerate(paths):
        first.setdefault(Path(path), file)
    return [(file, FileWatch(path, fds[file])) for path, file in first.items()]
