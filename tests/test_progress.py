"""Progress: a bar with an ETA on a terminal (tqdm), besides the plain log lines."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios

import pytest


def on_a_terminal(*argv: str) -> str:
    """What `streamer ARGV` writes to a 100-column terminal (stdout and stderr both)."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "streamer", *argv], stdout=follower, stderr=follower, close_fds=True
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert process.wait(timeout=300) == 0, seen.decode(errors="replace")
    return seen.decode(errors="replace")


def test_repack_shows_a_bar_on_a_terminal(checkpoints, tmp_path):
    """(Off a terminal the log lines alone are written: test_cli reads them.)"""
    text = on_a_terminal("repack", str(checkpoints.hf("qwen3_moe")), str(tmp_path / "b"))
    assert "[repack] experts:" in text and "/32 [" in text and "layer 2/2" in text
    assert "[repack] resident:" in text and "B/" in text  # the resident file, in bytes


@pytest.mark.parametrize("read_path", ["mapped", "slots"])
def test_making_every_expert_resident_at_load_shows_a_bar(checkpoints, read_path):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    text = on_a_terminal(
        "generate",
        "--model",
        str(folder),
        "--prompt",
        "hi",
        "--max-tokens",
        "1",
        "--read-path",
        read_path,
    )
    assert "all experts resident" in text and "experts into memory:" in text


def test_verify_shows_a_bar_on_a_terminal_and_lines_elsewhere(checkpoints, tmp_path):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    text = on_a_terminal("verify", str(folder))
    assert "[verify] checksums: 100%|" in text  # the bar, in bytes, at its end
    assert "layer 2/2" in text and "every checksum matches" in text
    plain = subprocess.run(
        [sys.executable, "-m", "streamer", "verify", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.returncode == 0 and "layer 2/2" in plain.stderr
    assert "checksums:" not in plain.stderr  # no bar off a terminal: the lines say it all
    # a download's checksums, recorded: the same bar over its shards
    download, sidecar = checkpoints.mlx("qwen3_moe"), tmp_path / "sums.json"
    text = on_a_terminal("verify", str(download), "--record", "--checksums", str(sidecar))
    assert "[verify] checksums: 100%|" in text and sidecar.exists()


def test_a_bar_of_bytes_counts_in_binary_units(monkeypatch):
    """A bar of bytes said "3.15M" for 3 MiB (tqdm's scale is 1000) beside the sizes every other
    line gives in binary units (docs/commands.md: `--memory-budget 8G` is 8 GiB)."""
    import io

    from streamer.progress import progress_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    with progress_bar(3 << 20, "[repack] resident", "B") as bar:
        bar.update(3 << 20)
    shown = sys.stderr.getvalue()
    assert "3.00M" in shown and "3.15M" not in shown, shown
