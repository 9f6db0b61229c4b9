"""`streamer launch`'s standard input, passed to every rank and closed at its end.

MLX's relay (mlx 0.32.4, `_launch_with_io`) reads the launcher's input in its main loop and queues
each read for every rank's thread, which writes it to the rank's stdin pipe; at end of input it
queues empty reads again and again and never closes the pipes, so a rank that reads its input to
the end (`generate --prompt -`, chat from a pipe or ended by Ctrl-D) waits for ever. Here MLX's
loop is handed an input that never has data, and each rank's thread a stdin it never writes to
(/dev/null); one thread reads the launcher's input and writers, one per rank, copy it to the
ranks' pipes and close them at its end. Every rank gets the input, as from MLX: each rank of a
`generate --prompt -` reads its own prompt (the ranks then compare them). A rank that reads
none (chat's followers) holds no other rank back: its writer waits alone on a full pipe.

A remote rank reads its input from the terminal `ssh -tt` opens on its host, whose end does not
follow from the ssh client's: its input is held until that terminal's echo is off
(launch_ranks.py: echoed, it came back in place of the line MLX reads first), and its end is typed
there as a user ends it, Enter if the last line has none, then Ctrl-D, again every second until
the ranks end (one that comes while a chat answers is lost: Linux keeps it as a NUL once readline
switches the terminal's mode), so a chat, or any reader of whole lines, ends. A terminal takes
lines of at most 1024 bytes (macOS) and reads control characters as keys: a remote `--prompt -`
is refused, as under mlx.launch (`STREAMER_INPUT_ENDS`, set here, is not passed over ssh).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from select import select

INPUT_ENDS = "STREAMER_INPUT_ENDS"  # in a rank's environment: its input's end will come
CHUNK = 65536
TYPED_END = b"\x04"  # a terminal's end-of-file key (Ctrl-D), typed at the start of a line
TYPED_END_EVERY = 1.0


class InputRelay:
    """The launcher's input as read so far (kept whole: every rank's writer goes through it at
    its own pace, one started late included) and whether it has ended."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._ended = False
        self._stopped = False
        self._more = threading.Condition()
        self._stand_ins: list = []
        self._holds: list[threading.Event] = []

    def take(self, process: subprocess.Popen, terminal: threading.Event | None = None) -> None:
        """Write the input to `process`'s stdin pipe from now on, closing it at the input's end;
        MLX's thread for the rank gets /dev/null in its place. A rank reading a remote
        `terminal` gets it once that is set (its echo is off), and its end typed."""
        pipe, process.stdin = process.stdin, open(os.devnull, "wb")  # noqa: SIM115 (closed below)
        self._stand_ins.append(process.stdin)
        held = terminal or threading.Event()
        if terminal is None:
            held.set()
        self._holds.append(held)
        args = (pipe, held, terminal is not None)
        threading.Thread(target=self._write, args=args, daemon=True).start()

    def read(self, stdin) -> None:
        """Read `stdin` (None where closed) to its end; a read that fails ends it too."""
        try:
            fd = stdin.fileno() if stdin is not None else None
        except (OSError, ValueError):
            fd = None
        while fd is not None:
            select([fd], [], [])  # an input left non-blocking (by mlx.launch) is waited for here
            try:
                chunk = os.read(fd, CHUNK)
            except BlockingIOError:
                continue
            except OSError:  # opened only for writing, or gone: no more to pass on
                chunk = b""
            if not chunk:
                break
            with self._more:
                self._chunks.append(chunk)
                self._more.notify_all()
        with self._more:
            self._ended = True
            self._more.notify_all()

    def _type_end(self, pipe) -> None:
        """The input's end typed as a user types it at a terminal, Enter unless at a line's
        start, then Ctrl-D, and Ctrl-D again every TYPED_END_EVERY seconds until the ranks have
        ended: one typed while the terminal's mode changes is lost (a chat's prompt switches it)."""
        last = self._chunks[-1][-1:] if self._chunks else b"\n"
        pipe.write(b"" if last == b"\n" else b"\n")
        stopped = False
        while not stopped:
            pipe.write(TYPED_END)  # not under the lock: a rank that reads none fills its pipe
            pipe.flush()
            with self._more:
                stopped = self._more.wait_for(lambda: self._stopped, TYPED_END_EVERY)

    def stop(self) -> None:
        """The ranks have ended (MLX's threads with them): their writers stop waiting."""
        with self._more:
            self._stopped = True
            self._more.notify_all()
        for stand_in in self._stand_ins:
            stand_in.close()
        for held in self._holds:
            held.set()

    def _write(self, pipe, held: threading.Event, typed_end: bool) -> None:
        held.wait()
        at = 0
        try:
            while True:
                with self._more:
                    while len(self._chunks) == at and not (self._ended or self._stopped):
                        self._more.wait()
                    chunks, ended = self._chunks[at:], self._ended or self._stopped
                    typed_end = typed_end and not self._stopped
                at += len(chunks)
                for chunk in chunks:
                    pipe.write(chunk)
                    pipe.flush()
                if ended:
                    if typed_end:
                        self._type_end(pipe)
                    break
        except OSError:  # the rank has ended, or closed its input: it reads no more
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass


@contextmanager
def relaying_input() -> Iterator[InputRelay]:
    """The launcher's input read by an InputRelay while MLX's relay runs, MLX's loop reading an
    idle pipe instead (and setting that one, not the terminal, non-blocking)."""
    relay = InputRelay()
    stdin = sys.stdin
    idle_read, idle_write = os.pipe()
    sys.stdin = open(idle_read, "rb", buffering=0)  # noqa: SIM115 (closed below)
    os.environ[INPUT_ENDS] = "1"  # the local ranks' environment, started from this one's
    threading.Thread(target=relay.read, args=(stdin,), daemon=True).start()
    try:
        yield relay
    finally:
        relay.stop()
        os.environ.pop(INPUT_ENDS, None)
        sys.stdin.close()
        sys.stdin = stdin
        os.close(idle_write)
