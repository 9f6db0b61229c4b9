"""Ctrl-C at any moment, the first seconds of imports included, exits 130 without a traceback."""

from __future__ import annotations

import importlib
import os
import signal
import threading

from .output import report


def import_exiting_on_ctrl_c(*modules: str) -> None:
    """Import a command's modules (mlx, mlx-lm, transformers: seconds) with Ctrl-C ending the
    process once they are imported: CPython can report a KeyboardInterrupt raised inside
    importlib's lock callbacks as "ignored" and carry on, and nothing is written yet that an exit
    could leave half done."""
    if threading.current_thread() is not threading.main_thread():
        return

    def exit_130(*_) -> None:
        os.write(2, b"\nstreamer: interrupted\n")
        os._exit(130)

    # SIGINT is held blocked while the imports run: delivered inside mlx's extension start-up
    # it can abort the process (nanobind) or be swallowed by importlib. Any Ctrl-C meanwhile
    # is pending, and ends the process once the imports are done.
    previous = signal.signal(signal.SIGINT, exit_130)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for module in modules:
            importlib.import_module(module)
    finally:
        if signal.SIGINT in signal.sigpending():
            exit_130()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, previous)


def interrupted_status() -> int:
    """Report Ctrl-C and ignore any further one: an interrupt that mlx's start-up turned into an
    ImportError can still be pending, and raised again on the way out it would end the process
    by SIGINT instead of with status 130."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return report("\nstreamer: interrupted", 130)


def caused_by_ctrl_c(error: BaseException | None) -> bool:
    """Whether a KeyboardInterrupt is in the error's chain of causes."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
