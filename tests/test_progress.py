"""Progress: a bar with an ETA on a terminal (tqdm), besides the plain log lines."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios


def test_repack_shows_a_bar_on_a_terminal(checkpoints, tmp_path):
    """(Off a terminal the log lines alone are written: test_cli reads them.)"""
    src = checkpoints.hf("qwen3_moe")
    command = [sys.executable, "-m", "streamer", "repack", str(src)]
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    process = subprocess.Popen(
        [*command, str(tmp_path / "b")], stdout=follower, stderr=follower, close_fds=True
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
    assert process.wait(timeout=300) == 0
    text = seen.decode(errors="replace")
    assert "[repack] experts:" in text and "/32 [" in text and "layer 2/2" in text
