"""Durability of a folder's entries: a file created, renamed or deleted in a folder survives a
power loss only once the folder itself is fsynced."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
