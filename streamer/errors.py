"""The one exception type users see: every message names the file or tensor at fault and what
to do."""

from __future__ import annotations

from collections.abc import Callable


class StreamerError(Exception):
    """A problem with the user's input, checkpoint or repacked folder, explained in the message.
    `flags`: the message as the command line says it, where it names an argument that the Python
    API spells otherwise (`--dtype float32` for `dtype='float32'`); the CLI prints that one."""

    def __init__(self, message: str = "", flags: str | None = None):
        super().__init__(message)
        self.flags = flags


class ArgumentError(StreamerError, ValueError):
    """A value the Python API was passed that it refuses (max_tokens=0, an empty prompt): also a
    ValueError, as mlx-lm raises for these, so code written for mlx-lm that catches ValueError
    catches it."""


def keyword(name: str, value: object = None) -> str:
    """An argument as the Python API spells it: `kv_group_size`, `dtype='float32'`."""
    return name if value is None else f"{name}={value!r}"


def flag(name: str, value: object = None) -> str:
    """The same argument as the command line spells it: `--kv-group-size`, `--dtype float32`."""
    option = "--" + name.replace("_", "-")
    return option if value is None else f"{option} {value}"


def refusal(message: Callable[[Callable[..., str]], str]) -> ArgumentError:
    """A refusal naming arguments, written once as `message(spell)`: its text spells them as the
    Python API does, its `flags` as the command line does (what the CLI prints)."""
    return ArgumentError(message(keyword), flags=message(flag))


def one_line(error: object, limit: int = 300) -> str:
    """A foreign exception's message as one line (libraries' messages span lines), shortened."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
