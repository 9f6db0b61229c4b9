"""io/reads.py: a read fetches from disk what it asks for, not the kernel's read-ahead beyond it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from streamer.io import reads
from streamer.io.reads import ReadFile, split

MiB = 1 << 20


def disk_read_bytes() -> int | None:
    """Bytes this process has caused to be fetched from storage (Linux /proc/self/io)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))
    except (OSError, StopIteration):
        return None


def test_every_descriptor_has_read_ahead_off(tmp_path, monkeypatch):
    """The advice is given on the page-cache descriptor of every ReadFile, bypassing or not."""
    advised = []
    monkeypatch.setattr(reads, "no_read_ahead", advised.append)
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    for bypass in (False, True):
        file = ReadFile(path, bypass)
        assert advised[-1] == file.fd
        file.close()
    assert len(advised) == 2


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="Linux's page cache control")
def test_a_cold_record_fetches_only_its_bytes(tmp_path):
    """A 2.5 MiB record of a dropped 64 MiB file, read as the pool reads one (consecutive 512 KiB
    pieces), brings in 2.5 MiB from disk. With the kernel's read-ahead on, the pieces look like a
    sequential scan and it brought in 7.5 MiB on this machine (read_ahead_kb 8192)."""
    path = tmp_path / "experts"
    path.write_bytes(np.random.default_rng(0).integers(0, 255, 64 * MiB, dtype=np.uint8))
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # dirty pages are not dropped
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    file = ReadFile(path, False)
    record = np.empty(5 * MiB // 2, dtype=np.uint8)
    before = disk_read_bytes()
    for piece in split((0, 4 * MiB, [record]), MiB // 2):
        file.preadv(piece[1], piece[2])
    after = disk_read_bytes()
    file.close()
    if before is None or after == before:
        pytest.skip("no block-device read accounting here (tmpfs, or no /proc/self/io)")
    assert after - before <= record.nbytes + 64 * 1024
    assert record.tobytes() == path.read_bytes()[4 * MiB : 4 * MiB + record.nbytes]
