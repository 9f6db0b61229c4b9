"""Ctrl-C at any moment, the first seconds of imports included, exits 130 without a traceback.

Until a command starts its work (writing files, generating, conversing), nothing is written that
an exit could leave half done, so there Ctrl-C ends the process at once: `main` runs every command
inside `exiting_on_ctrl_c`. That spans the imports (mlx, mlx-lm, transformers: seconds) and the
ones mlx-lm and transformers make lazily while a model loads (the model's module, its tokenizer
and config classes), which no list of modules imported up front can name. A KeyboardInterrupt
raised in those is not reliable: importlib can report one raised in its lock callbacks as
"ignored" and carry on, and one raised inside mlx's extension start-up aborts the process
(nanobind). A command's work runs inside `raising_on_ctrl_c`, where Ctrl-C raises
KeyboardInterrupt for the command to handle (repack keeps its progress, generate prints its stats).

A request to stop (SIGTERM: `kill`, `systemctl stop`, `docker stop`; SIGHUP: the terminal closed)
takes the same path as Ctrl-C, with the exit status 128 + its number: Python's default ended the
process on the spot, a repack without its resume hint, serve under an in-flight write. In work,
it raises `Terminated`, a KeyboardInterrupt, so every handler of Ctrl-C handles it; chat, which
goes on after a Ctrl-C that stops an answer, ends on it. A signal the process was started
ignoring (nohup's SIGHUP) stays ignored.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from .output import report

NOTICE = "streamer: interrupted"
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, then the requests to stop


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def status_of(interrupt: BaseException) -> int:
    """The exit status for an interrupt: 130 for Ctrl-C, 128 + the signal's number else."""
    return 128 + (interrupt.signum if isinstance(interrupt, Terminated) else signal.SIGINT)


def _exit_at_once(signum: int, _frame=None) -> None:
    os.write(2, f"\n{NOTICE}\n".encode())
    os._exit(128 + signum)


def _raise(signum: int, _frame) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _handle(handler) -> dict:
    """Set `handler` for each signal in STOPS (but one ignored from the start, other than
    Ctrl-C's); returns the handlers it replaced, by signal."""
    previous = {}
    for number in STOPS:
        if number == signal.SIGINT or signal.getsignal(number) is not signal.SIG_IGN:
            previous[number] = signal.signal(number, handler)
    return previous


def _restore(previous: dict) -> None:
    for number, handler in previous.items():
        signal.signal(number, handler)


@contextmanager
def exiting_on_ctrl_c(restore: bool = True) -> Iterator[None]:
    """Ctrl-C ends the process with status 130 at once. `restore`: put the previous handler
    back at the end, for callers in a process that goes on; without it, Ctrl-C is ignored from
    then on: the program is ending with its status (Python's own handler, back while it shuts
    down, would end the process by SIGINT)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = _handle(_exit_at_once)
    try:
        yield
    finally:
        _restore(previous if restore else dict.fromkeys(previous, signal.SIG_IGN))


@contextmanager
def raising_on_ctrl_c() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt, for work that cleans up after itself or reports on the
    way out; afterwards (the command handling it) it ends the process at once again."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = _handle(_raise)
    try:
        yield
    finally:
        _restore(previous)


@contextmanager
def second_ctrl_c_exits() -> Iterator[None]:
    """The first Ctrl-C is the started processes' to handle: a terminal's reaches its whole
    foreground process group, so they get it too and end as they choose, while this process
    goes on relaying what they say; a second one ends it with status 130 at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: signal.signal(signal.SIGINT, _exit_at_once))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def stopping_first(commands: list) -> Iterator[None]:
    """SIGTERM or SIGHUP (a CI job's timeout, `kill`, a closed terminal) `terminate()` the
    started commands first (mlx.launch's ranks: not in this process's group, a serving group ran
    on without its launcher); their ends then end the launch, with their status."""

    def stop(*_) -> None:
        for command in list(commands):
            command.terminate()

    previous = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def end_interrupted(interrupt: KeyboardInterrupt) -> NoReturn:
    """Report Ctrl-C and end the process now, without Python's shutdown: for a command whose
    other threads may be computing in MLX (serve's generation thread, mid-answer), under which
    that shutdown destroys MLX's state, and the process aborts (`terminate called without an
    active exception`, SIGABRT) instead of exiting 130."""
    _ignore_stops()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by its reader: nothing more reaches it
            pass
    _exit_at_once(status_of(interrupt) - 128)


def interrupted_status(interrupt: KeyboardInterrupt) -> int:
    """Report Ctrl-C and ignore any further one: the process is ending with its status."""
    if threading.current_thread() is threading.main_thread():
        _ignore_stops()
    return report(f"\n{NOTICE}", status_of(interrupt))


def _ignore_stops() -> None:
    for number in STOPS:
        signal.signal(number, signal.SIG_IGN)


def interrupt_in(error: BaseException | None) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt in the error's chain of causes, if one is."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
