"""Durability of a folder's entries: a file created, renamed or deleted in a folder survives a
power loss only once the folder itself is fsynced; a file replaced whole survives as the old or
the new one."""

from __future__ import annotations

import contextlib
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
