"""streamer: run MoE language models larger than RAM by streaming their experts from SSD.

The public names are imported on first use: importing mlx-lm (and transformers with it) takes
seconds, and `streamer --help`, `info` and `plan` need neither.
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from .errors import ArgumentError, StreamerError
from .io.descriptors import allow_mlx_lm

allow_mlx_lm()  # before anything imports mlx-lm, whose import sets the open-file limit

if TYPE_CHECKING:
    from .generate import generate, stream_generate
    from .loading.load import load
    from .response import Response
    from .run_stats import RunStats

try:
    __version__ = version("streamer")
except PackageNotFoundError:  # a source tree that was not installed
    __version__ = "0+unknown"

_LAZY = {
    "Response": "response",
    "RunStats": "run_stats",
    "generate": "generate",
    "stream_generate": "generate",
    "load": "loading.load",
}

__all__ = [
    "ArgumentError",
    "StreamerError",
    "Response",
    "RunStats",
    "generate",
    "load",
    "stream_generate",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    """Importing a submodule binds it on its package: `streamer.generate` the function must not
    become `streamer.generate` the module once something imports the module."""

    def __setattr__(self, name: str, value) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
