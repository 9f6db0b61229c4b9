"""What the repack fault tests check after a fault: a folder untouched, a repack identical to an
uninterrupted one, a destination absent or complete, and a repack stopped after a given layer."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamer.repack import repack
from streamer.verify import verify

QUIET = {"log": lambda _: None}


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """(mtime_ns, sha256) of every file: proves a folder was not touched."""
    return {
        str(p.relative_to(folder)): (
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def assert_same_model(folder: Path, reference: Path) -> None:
    """Byte-identical files; the manifest identical except the recorded file times."""
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert names == sorted(
        str(p.relative_to(reference)) for p in reference.rglob("*") if p.is_file()
    )
    for name in names:
        if name != "manifest.json":
            assert (folder / name).read_bytes() == (reference / name).read_bytes(), name
    ours, theirs = (json.loads((f / "manifest.json").read_text()) for f in (folder, reference))
    assert ours.pop("files").keys() == theirs.pop("files").keys()
    assert ours == theirs
    assert verify(folder, **QUIET) == []


def assert_absent_or_complete(dst: Path) -> bool:
    if dst.exists():
        assert verify(dst, **QUIET) == []
    return dst.exists()


def interrupted_repack(source: Path, dst: Path, after: str) -> Path:
    """Repack `source` to `dst` with Ctrl-C once a log line holds `after`; its progress file."""

    def interrupt(message):
        if after in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack(source, dst, log=interrupt)
    return dst.parent / f".{dst.name}.partial" / "progress.json"


def resumed_by_the_command(source: Path, dst: Path, *flags: str) -> None:
    """`streamer repack SOURCE DST --resume [flags]`, in a new process, finishes the interrupted
    repack from the work it kept."""
    command = [sys.executable, "-m", "streamer", "repack", str(source), str(dst), "--resume"]
    result = subprocess.run([*command, *flags], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "kept from the interrupted run" in result.stderr


def rewrite(path: Path, data: bytes) -> None:
    """Write `data` over `path` as a new revision of it would come: its modification time a
    second later (a coarse clock keeps the time of a write within the same tick)."""
    path.write_bytes(data)
    later = path.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(later, later))


def rewrite_at_its_size(path: Path) -> None:
    """Another revision of `path` at the same size: its last byte other (a header alike)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    rewrite(path, bytes(data))
