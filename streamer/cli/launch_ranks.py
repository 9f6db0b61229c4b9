"""`streamer launch`'s ranks: MLX's command class (mlx 0.32.4, RemoteProcess) extended to record
how each rank ends, and to run a rank on another host as well as one on this one.

A rank on another host runs in the terminal `ssh -tt` opens there, which MLX's class does not
allow for: the terminal writes `\\r\\n`, so the pid file named on the rank's first line was read as
`/tmp/tmp.X\\r` and the kill script MLX runs to stop the rank failed (a CalledProcessError
traceback from its thread); it echoes what it is given until the script turns its echo off, so
input passed on at once came back in place of that line; and it carries the rank's stderr on its
stdout, so the failing rank's last words were not found. MLX took the first output of either
stream for that line: ssh's own error (a host it cannot reach) was dropped.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field

from .input_relay import InputRelay


@dataclass
class RankEnd:
    """How a rank ended: its status, whether the launcher stopped it, its last stderr line."""

    rank: int
    status: int
    stopped: bool
    last_line: str
    at: float = field(default_factory=time.monotonic)


@dataclass
class Ranks:
    """The ranks' ends as they come; the running commands; a rank that ended alone."""

    grace: float
    ends: list[RankEnd] = field(default_factory=list)
    commands: list = field(default_factory=list)
    alone: RankEnd | None = None


def recorder(command_class: type, ranks: Ranks, given: InputRelay) -> type:
    """`command_class` recording each rank's end in `ranks.ends` (in the order they end), its
    input passed on by `given`."""
    ends = ranks.ends

    class Recorded(command_class):
        def __init__(self, rank: int, *args, **kwargs):
            self._echo_off = threading.Event()  # set at the rank's first line
            super().__init__(rank, *args, **kwargs)
            given.take(self.process, None if self._is_local else self._echo_off)
            self._rank, self._stopped, self._err = rank, False, ""
            ranks.commands.append(self)

        def preprocess_output(self, data: str, is_stdout: bool = False) -> str:
            if is_stdout or self._pidfile is not None:
                text = super().preprocess_output(data, is_stdout)
            else:  # not the pid file's name, which comes on stdout: ssh's own error, say
                text = data
            if self._pidfile is not None and not self._echo_off.is_set():
                self._pidfile = self._pidfile.rstrip("\r")  # a remote terminal's `\r\n`
                self._echo_off.set()
            if not is_stdout or not self._is_local:  # a remote terminal carries stderr too
                self._err = (self._err + text)[-4096:]  # enough for the last line
            return text

        def terminate(self):
            self._stopped = True
            try:
                return super().terminate()
            except subprocess.CalledProcessError:
                pass  # its host was not reached to kill it: ending its ssh hung its terminal up

        @property
        def exit_status(self):
            status = super().exit_status
            if status[0] is not None and not any(end.rank == self._rank for end in ends):
                lines = [line for line in self._err.splitlines() if line.strip()]
                last = lines[-1].strip() if lines else ""
                ends.append(RankEnd(self._rank, status[0], self._stopped, last))
            return status

    return Recorded
