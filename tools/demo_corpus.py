"""What the demo model trains on: the Python standard library's own source, present on every
machine, split by file into training and held-out text."""

from __future__ import annotations

import sysconfig
from pathlib import Path


def corpus_files() -> tuple[list[Path], list[Path]]:
    """Standard library modules (tests excluded), split by file: every 20th file is held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test"}
    files = sorted(f for f in root.rglob("*.py") if not skip & set(f.relative_to(root).parts))
    return [f for i, f in enumerate(files) if i % 20], files[::20]


def read_texts(files: list[Path]) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]
