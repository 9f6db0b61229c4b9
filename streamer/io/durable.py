"""Durability of a folder's entries: a file created, renamed or deleted in a folder survives a
power loss only once the folder itself is fsynced; a file replaced whole survives as the old or
the new one."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: dict) -> None:
    """`data` as `path`, through a fsynced temporary file renamed over it: whole or not at all (a
    failure, a full disk or Ctrl-C, removes the temporary)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_failure(error: OSError, folder: Path) -> tuple[str, str]:
    """Why writing into `folder` failed, and what to do first ("" where only the user can
    tell), for a one-line error."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk holding {folder} is full", "free space"
    if error.errno == errno.EFBIG:  # a FAT32 disk's 4 GiB, or `ulimit -f` (SIGXFSZ is ignored)
        return (
            f"a file in {folder} grew past the largest file allowed there (by its file system, "
            "or by `ulimit -f`)",
            "choose a destination on another file system or raise the limit",
        )
    where = f" ({error.filename})" if error.filename else ""
    return f"an I/O error: {error.strerror or error}{where}", ""


def next_step(fix: str, then: str) -> str:
    """`write_failure`'s fix, if any, then `then`, as a sentence."""
    step = f"{fix}, then {then}" if fix else then
    return step[0].upper() + step[1:]
