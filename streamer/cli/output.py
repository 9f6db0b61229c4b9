"""Where a command's words go: its output on stdout, its errors as one line on stderr."""

from __future__ import annotations

import argparse
import codecs
import os
import sys
from typing import TextIO

from ..errors import StreamerError


class OutputFailed(Exception):
    """Writing the command's output failed: its reader went away, or the device is full."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def emit(text: str = "", end: str = "\n", file: TextIO | None = None) -> None:
    """Write the command's output (generated text, info) to stdout (or chat's `file`)."""
    try:
        print(text, end=end, file=file, flush=True)
    except OSError as e:
        raise OutputFailed(e) from e


def set_up_output() -> None:
    """The program's stdout and stderr, ready for whatever a command writes."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        # started without it (`2>&-`, a daemon's closed descriptors), Python's stream is None:
        # print(file=None) wrote the logs into stdout, then the progress bar's isatty() raised;
        # and the file opened next took its number, where a write to fd 2 (Ctrl-C's line, a
        # native library's) would land. /dev/null takes it, and every closed one below it.
        if getattr(sys, name) is None:
            while (null := os.open(os.devnull, os.O_WRONLY)) < fd:
                pass
            setattr(sys, name, open(null, "w"))  # open as long as the process
    # Generated text holds characters of every script; an output in an encoding that lacks some
    # (LANG=en_US.ISO-8859-1, PYTHONIOENCODING=ascii) shows them as "?", as iconv would. print
    # raised UnicodeEncodeError at the first one: a traceback, and chat's process aborted.
    if hasattr(sys.stdout, "reconfigure") and codecs.lookup(sys.stdout.encoding).name != "utf-8":
        sys.stdout.reconfigure(errors="replace")


def report(line: str, status: int) -> int:
    """Say one line on stderr and return the exit status."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass  # stderr itself is closed or full: the exit status still says it
    return status


def silence_output() -> None:
    """Point stdout at /dev/null so that Python's flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def error_line(args: argparse.Namespace | None, error: StreamerError) -> str:
    """One line; in a group, naming the rank, and said once for a fault every rank finds."""
    text = " ".join((getattr(error, "flags", None) or str(error)).split())
    group = getattr(args, "group", None)
    if group is None:
        return f"streamer: error: {text}"
    from ..parallel.group import GroupError

    if isinstance(error, GroupError):
        return f"streamer: error: {text}" if group.rank() == 0 else ""
    return f"streamer: error: rank {group.rank()}: {text}"
