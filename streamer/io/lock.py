"""Advisory locks on a repacked folder, so a repack never replaces a folder a model is reading.

A loaded model holds a shared flock on its manifest.json for as long as it lives; `repack --force`
takes an exclusive one before replacing the folder and refuses if it cannot. flock exists on Linux
and macOS; the lock goes away with the process, so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import BinaryIO

from ..errors import StreamerError
from .manifest import MANIFEST_FILE


class FolderLock:
    """Holds an flock on a file until `release()` or until garbage collection closes the file."""

    def __init__(self, file: BinaryIO):
        self._file = file

    def release(self) -> None:
        self._file.close()


def _lock(path: Path, mode: int, refusal: str) -> FolderLock | None:
    """An flock on `path`; StreamerError(`refusal`) if another process holds it. None if `path`
    does not exist or the file system has no flock (some network mounts): the locks only guard
    against mistakes."""
    try:
        file = open(path, "rb")
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(file.fileno(), mode | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        raise StreamerError(refusal) from None
    except OSError:
        file.close()
        return None
    return FolderLock(file)


def lock_for_reading(folder: Path) -> FolderLock | None:
    """A shared lock on a repacked folder while a model reads it; refused during a
    `repack --force` into it."""
    return _lock(
        Path(folder) / MANIFEST_FILE,
        fcntl.LOCK_SH,
        f"{folder} is being replaced by `streamer repack --force` in another process: wait for "
        "it to finish.",
    )


def lock_for_replacing(folder: Path) -> FolderLock | None:
    """An exclusive lock on a repacked folder that is about to be replaced; refused while a
    model reads it."""
    return _lock(
        Path(folder) / MANIFEST_FILE,
        fcntl.LOCK_EX,
        f"{folder} is in use: another process has a model loaded from it (or is repacking into "
        "it). Stop that process first, or repack into another folder.",
    )


def lock_download_for_reading(folder: Path) -> FolderLock | None:
    """A shared lock on a download a model streams from in place (on its config.json); refused
    while `repack --delete-source` deletes its shards."""
    return _lock(
        Path(folder) / "config.json",
        fcntl.LOCK_SH,
        f"{folder} is being repacked with --delete-source in another process, which deletes "
        "its shards: use the repacked model when it is done.",
    )


def lock_source_for_deleting(folder: Path) -> FolderLock | None:
    """An exclusive lock on a download whose shards `repack --delete-source` deletes; refused
    while a model streams from it in place."""
    return _lock(
        Path(folder) / "config.json",
        fcntl.LOCK_EX,
        f"{folder} is in use: another process streams a model from it in place (or repacks "
        "it with --delete-source). Stop that process first, or repack without --delete-source.",
    )


def repack_in_use(path: Path) -> StreamerError:
    """The refusal of a destination's .partial folder another `streamer repack` (or split) holds."""
    return StreamerError(
        f"{path} is in use by another `streamer repack` (writing the same destination): wait "
        "for it to finish."
    )


def lock_directory(path: Path) -> int | None:
    """An exclusive flock on a directory itself, e.g. a repack's .partial folder: the fd to close,
    or None where directories cannot be locked. One removed since it was made (by another
    repack starting at the same moment, taking it for a stale one) is refused as locked."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise repack_in_use(path) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise repack_in_use(path) from None
    except OSError:
        os.close(fd)
        return None
    return fd
