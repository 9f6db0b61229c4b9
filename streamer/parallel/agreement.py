"""The ranks of a group must run one command alike: a rank with another prompt, token budget,
sampling, KV cache or compute dtype computes other tokens, so its MoE layers' all_sums add rows of
other tokens (garbage), wait for a collective the others never make (a hang), or take a different
size (the ring then fails with no word of why). `streamer launch` gives every rank the same
options, but a wrapper script, another streamer's defaults or a host's own settings need not:
checked once after the load, before the first collective of the run, on every rank.
"""

from __future__ import annotations

import argparse
import json
import zlib

import mlx.core as mx
import numpy as np

from .group import GroupError, _all_gather

# What each machine decides for itself without changing a token: its own folder (the load-time
# check compares the model), how it holds and reads its experts, the cores it cuts its matmuls
# across (bit for bit the same, cpu_cores.py), and its seed (rank 0's is used); and the draft
# model a rank loaded (its flags are compared).
NOT_COMPARED = frozenset(
    {
        "model",
        "memory_budget",
        "read_path",
        "verify_reads",
        "checksums",
        "threads",
        "seed",
        "api_key",
        "drafting",
    }
)
SHOWN_CHARS = 40  # of a setting's value in the error line (a prompt can be long)
ROW_BYTES = 16384  # the JSON of every setting, shown values and checksums


def command_settings(
    args: argparse.Namespace, model, version: str, **computed: object
) -> dict[str, object]:
    """The options of a command that every rank must share, `computed` (what a rank made of
    them, named in words: "the templated prompt") over the flags, the dtype the model computes
    in, and the `version` of streamer and MLX's that run it (another's defaults, arithmetic or
    messages between the ranks may differ)."""
    flags = {
        name: value
        for name, value in vars(args).items()
        if name not in NOT_COMPARED
        and not callable(value)
        and not isinstance(value, mx.distributed.Group)
    }
    versions = {"streamer version": version, "mlx version": mx.__version__}
    return {**versions, **flags, **computed, "dtype": model.streamer.dtype}


def check_same_settings(group: mx.distributed.Group, settings: dict[str, object]) -> None:
    """Raise GroupError, on every rank, naming the first rank and setting unlike rank 0's."""
    mine = {
        name: [_shown(value), zlib.crc32(repr(value).encode())] for name, value in settings.items()
    }
    text = json.dumps(mine).encode()  # well within ROW_BYTES: values are cut
    row = np.zeros(ROW_BYTES, dtype=np.uint8)
    row[: len(text)] = np.frombuffer(text, dtype=np.uint8)
    ranks = [json.loads(bytes(r).rstrip(b"\0")) for r in _all_gather(group, row)]
    first = ranks[0]
    for rank, theirs in enumerate(ranks[1:], start=1):
        for name in [*first, *(name for name in theirs if name not in first)]:  # in order
            if first.get(name) != theirs.get(name):
                raise GroupError(
                    f"rank {rank} runs with {_difference(name, first, theirs)}: every rank must "
                    f"compute the same tokens, so {_remedy(name)}."
                )


def _remedy(name: str) -> str:
    if name.endswith(" version"):
        return "install the same versions of streamer and mlx on every host"
    return "give every rank the same options (streamer launch passes them all the same ones)"


def _shown(value: object) -> str:
    # a prompt's newlines escaped: the error stays one line
    text = value if isinstance(value, str) and value.isprintable() else repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _difference(name: str, first: dict, theirs: dict) -> str:
    flag = name if " " in name else "--" + name.replace("_", "-")  # a flag, or words
    shown = [s[name][0] if name in s else "(none)" for s in (theirs, first)]
    if shown[0] == shown[1]:  # they differ past what is shown
        return f"{flag} unlike rank 0's (both begin {shown[0]!r})"
    return f"{flag} {shown[0]} and rank 0 with {shown[1]}"
