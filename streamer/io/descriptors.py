"""The process's open-file limit: mlx-lm sets it when imported, a model's expert files need it.

`mlx_lm.utils` calls `resource.setrlimit(RLIMIT_NOFILE, (2048, 4096))` at import. Under a hard
limit below 4096 (`ulimit -n 1024` as a user, a container's limit) that raises ValueError, "not
allowed to raise maximum limit", and no command that loads a model could start. `allow_mlx_lm`
imports it then with the limit it asks for set as far as the hard limit allows.

Streamer itself keeps each expert file open while the model lives: one descriptor per file on the
mapped read path, two on Linux's slot path (a second one opened O_DIRECT); a repacked model has
one file per MoE layer (94 for a 94-layer model), a download its shards. `check_open_files` sees
to it that the limit holds them before they are opened, raising the soft limit where it can.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Iterable
from pathlib import Path

from ..errors import StreamerError

NOFILE = resource.RLIMIT_NOFILE
MLX_LM_HARD = 4096  # the hard limit mlx_lm.utils asks for at import
HEADROOM = 64  # descriptors beyond the expert files: weights being read, a server's connections
_setrlimit = resource.setrlimit


def allow_mlx_lm() -> None:
    """Under a hard limit below mlx-lm's, import mlx_lm.utils now with its setrlimit held within
    the hard limit, instead of failing; nothing to do otherwise (where the import, seconds for
    transformers', stays lazy), or once it is imported."""
    hard = resource.getrlimit(NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard >= MLX_LM_HARD or "mlx_lm.utils" in sys.modules:
        return
    resource.setrlimit = _within_hard
    try:
        import mlx_lm.utils  # noqa: F401
    finally:
        resource.setrlimit = _setrlimit


def _within_hard(which: int, limits: tuple[int, int]) -> None:
    """resource.setrlimit, with the limits asked for lowered to the hard limit in force."""
    hard = resource.getrlimit(which)[1]
    if hard != resource.RLIM_INFINITY:
        limits = tuple(hard if n == resource.RLIM_INFINITY else min(n, hard) for n in limits)
    _setrlimit(which, limits)


def check_open_files(files: Iterable[Path], per_file: int) -> None:
    """Make the soft limit hold `files` kept open (`per_file` descriptors each) beside what is
    open now; refuse, saying what to run, where the hard limit cannot."""
    files = set(files)
    needed = _open_now() + len(files) * per_file + HEADROOM
    soft, hard = resource.getrlimit(NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise StreamerError(
            f"the model keeps {len(files)} expert files open, and with what else is open that "
            f"needs about {needed} file descriptors; this process may open {hard} (the hard "
            f"limit): run `ulimit -n {max(MLX_LM_HARD, needed)}` (or raise the limit of the "
            "service or container) and start again."
        )
    _setrlimit(NOFILE, (needed, hard))


def _open_now() -> int:
    for listing in ("/proc/self/fd", "/dev/fd"):  # Linux's, macOS's
        if os.path.isdir(listing):
            return len(os.listdir(listing))
    return 0
