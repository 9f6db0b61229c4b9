"""A file the model reads, watched while the model runs: one stat per layer call.

A file overwritten in place while the model streams from it (a download's shard fetched again, a
repacked expert file rewritten, same size, other bytes) changes what the experts compute, and
nothing else would say so: the mapped path sees the new page-cache bytes, the slot path reads
them. Every layer call therefore stats the open descriptor (fstat, not the path) and compares its
size and modification time with what they were at load: a change is noticed at the next layer
call that reads the file, within the token it happened in, and generation stops with one line
naming the file. A stat is a few microseconds, a layer call milliseconds.

The path is not what is watched: a folder deleted, or a file replaced by a new one (a repack into
the same path, `os.replace`), leaves the open file's bytes as they were, and the model runs on
them to the end, as it would had it read them all at load.

A write that keeps the size and restores the time (`touch -r`) is not seen here; `--verify-reads`
checks each expert's crc32 as its bytes come from disk.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


class FileWatch:
    """What an open file was when it was opened, to tell whether its bytes changed since."""

    def __init__(self, path: Path, fd: int):
        self.path = Path(path)
        self._fd = fd
        self._was = identity(os.fstat(fd))

    def change(self) -> str | None:
        """How the open file differs from what it was when opened, in words; None if it does
        not."""
        try:
            now = identity(os.fstat(self._fd))
        except OSError as e:  # closed: the model was closed under the run
            return f"was closed ({e.strerror or e})"
        if now[:2] != self._was[:2]:  # its number now names another file: closed and reused
            return "was closed"
        if now[2] != self._was[2]:
            return f"changed size ({self._was[2]} bytes, now {now[2]})"
        if now[3] != self._was[3]:
            return "was written to (its modification time moved)"
        return None


def identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a file's bytes changed: its device and inode (another file), size and mtime."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def watch_files(paths: Sequence[Path], fds: Sequence[int]) -> list[tuple[int, FileWatch]]:
    """(file number, watch) for each distinct file of `paths` (a layer's files, a path listed
    once per tensor it holds), opened as `fds` in the same order."""
    first: dict[Path, int] = {}
    for file, path in enumerate(paths):
        first.setdefault(Path(path), file)
    return [(file, FileWatch(path, fds[file])) for path, file in first.items()]
