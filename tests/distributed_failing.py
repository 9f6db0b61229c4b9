"""`streamer chat` on one rank of an expert-parallel group whose MoE layer fails on rank 1 at its
FAIL_AT-th call, as a read error would (run by mlx.launch from tests/test_distributed_serve.py):
the group must end with that error, not hang."""

from __future__ import annotations

import os
import sys

from streamer.cli import main
from streamer.experts.parallel import ExpertShare

FAIL_AT = 7  # 2 MoE layers: the prompt's two calls, then the third decode step
calls = 0
compute = ExpertShare.__call__


def failing(self, *args, **kwargs):
    global calls
    calls += 1
    if os.environ.get("MLX_RANK") == "1" and calls == FAIL_AT:
        raise OSError(5, "Input/output error (injected)")
    return compute(self, *args, **kwargs)


ExpertShare.__call__ = failing
sys.exit(main(["chat", *sys.argv[1:]]))
