"""Starting a command on 2 ranks with mlx.launch (ring backend, 127.0.0.1), as users start it
across Macs, bounded in time: the expert-parallel tests' launcher."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

LAUNCH_SECONDS = 240  # a launch takes 10-30 s here; a hang fails the test instead of the suite
RANKS = 2


# Below the kernels' ephemeral ranges (Linux 32768-60999, macOS 49152-65535): a port chosen here
# and free when probed cannot be taken, before the ranks bind it, by some process's outgoing
# connection (the machine runs other tests' servers and clients meanwhile).
PORTS = range(20000, 32000)


def free_ports(count: int = RANKS) -> int:
    """A base port with `count` free ports after it (mlx.launch gives rank r base + r)."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(PORTS.start, PORTS.stop - count)
        sockets = [socket.socket() for _ in range(count)]
        try:
            for i, s in enumerate(sockets):
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} free ports in a row on 127.0.0.1 in {PORTS}")


def start(
    command: list[str], cwd: Path, typed: str = "", streamer: bool = False, ends: bool = False
) -> subprocess.Popen:
    """mlx.launch (`streamer launch` with `streamer`) running `command` on RANKS ranks, in a
    process group of its own (the ranks go down with it on a timeout), Ctrl-C reaching it as
    from a terminal, `typed` on its input.

    Its input stays open and idle after `typed`, as a terminal's does, or with `ends` ends there
    (a pipe, for `streamer launch`, which passes the end on). At end of input (a closed
    pipe, /dev/null) mlx.launch's main loop never waits: it passes an empty read to every rank's
    queue again and again, so a Ctrl-C can land inside a queue's lock, which the interrupt can
    leave held; that rank's thread then waits on it forever and mlx.launch never ends (seen once
    in 10 runs of the serve test). Idle input keeps that loop waiting in select() instead."""
    launcher = [shutil.which("mlx.launch") or str(Path(sys.executable).with_name("mlx.launch"))]
    if streamer:
        launcher = [sys.executable, "-m", "streamer", "launch"]
    argv = [*launcher, "--backend", "ring", "--hosts", "127.0.0.1", "-n", str(RANKS)]
    argv += ["--starting-port", str(free_ports()), "--", *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=read_end,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            # a runner started in the background can leave SIGINT ignored, and so every rank
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    finally:
        os.close(read_end)
    os.write(write_end, typed.encode())  # a few lines: within the pipe's buffer
    if ends:
        os.close(write_end)
    else:
        weakref.finalize(process, os.close, write_end)  # open as long as the launch is
    return process


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    """Wait for a launch; killed, and the test failed, if it hangs."""
    try:
        out, err = proc.communicate(timeout=LAUNCH_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"mlx.launch did not finish in {LAUNCH_SECONDS} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def launch(
    command: list[str], cwd: Path, stdin: str = "", streamer: bool = False, ends: bool = False
) -> subprocess.CompletedProcess:
    """Run `command` on RANKS ranks to its end, `stdin` typed on its input (its end with `ends`)."""
    return finish(start(command, cwd, stdin, streamer, ends))
