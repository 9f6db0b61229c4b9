"""Sharing each MoE layer's experts out among the ranks of an expert-parallel group.

A decode token's cost on one machine is its routed experts' reads and compute; split across N
machines, each pays for the routed experts it owns. The shares should carry similar traffic:
interleaving (expert e to rank e mod N) does when routing is near uniform; a routing trace
(tools/routing_summary.py --trace) lets hot experts be spread: each layer's experts, hottest
first, go to the rank with the least traffic so far among those not yet holding their E/N.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from ..errors import StreamerError
from ..io.files import open_regular
from ..io.manifest import Manifest


def interleaved(num_experts: int, ranks: int) -> np.ndarray:
    """The owning rank of each expert: e mod ranks."""
    return np.arange(num_experts) % ranks


def balanced(counts: np.ndarray, ranks: int) -> np.ndarray:
    """The owning rank of each expert, from how often each was routed: equal expert counts per
    rank (within one), the hottest placed first on the least loaded rank with room."""
    room = np.full(ranks, len(counts) // ranks) + (np.arange(ranks) < len(counts) % ranks)
    load = np.zeros(ranks)
    owner = np.empty(len(counts), dtype=np.int64)
    for expert in np.argsort(-counts, kind="stable"):
        open_ranks = np.flatnonzero(room > 0)
        rank = open_ranks[np.argmin(load[open_ranks])]
        owner[expert] = rank
        load[rank] += counts[expert]
        room[rank] -= 1
    return owner


def owners(manifest: Manifest, ranks: int, trace: Path | None = None) -> list[np.ndarray]:
    """The owning rank of every expert of every MoE layer of a full (unsplit) model."""
    layers = [layer.num_experts for layer in manifest.layers]
    if ranks < 2 or ranks > min(layers):  # one shard of one would be loaded nowhere: no group
        raise StreamerError(
            f"cannot share {min(layers)} experts per layer among {ranks} ranks: "
            f"use 2 to {min(layers)} ranks (for one, load the repacked folder itself)."
        )
    if trace is None:
        return [interleaved(n, ranks) for n in layers]
    counts = trace_counts(trace, layers)
    return [balanced(c, ranks) for c in counts]


DEFLATE_RATIO = 1032  # the most deflate expands: a member's bytes are at most this its stored


def trace_counts(path: Path, layers: list[int]) -> list[np.ndarray]:
    """How often each expert of each MoE layer was routed in a trace (.npz with `experts`:
    [tokens, moe_layers, top_k] routed ids, as tools/routing_summary.py --trace writes)."""
    fix = "give an .npz written by tools/routing_summary.py --trace."
    try:
        with os.fdopen(open_regular(path, "a routing trace"), "rb") as f:  # a FIFO is refused
            if not zipfile.is_zipfile(f):  # np.load would take it for a pickle, and say so
                raise ValueError("not an .npz archive, a zip of .npy arrays")
            size = os.fstat(f.fileno()).st_size
            with zipfile.ZipFile(f) as archive:
                member = archive.getinfo("experts.npy")
                with archive.open(member) as npy:
                    shape, dtype = _npy_header(npy)
                # what the member can hold: its size as the zip says, and as deflate can make
                held = min(member.file_size, DEFLATE_RATIO * min(member.compress_size, size))
                _check_routed(path, shape, dtype, held, layers)
                with archive.open(member) as npy:
                    routed = np.lib.format.read_array(npy, allow_pickle=False)
    except KeyError:
        raise StreamerError(f"the routing trace {path} holds no 'experts' array: {fix}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise StreamerError(f"cannot read the routing trace {path} ({e}): {fix}") from e
    counts = []
    for index, num_experts in enumerate(layers):
        ids = routed[:, index].ravel()
        wrong = ids[(ids < 0) | (ids >= num_experts)]
        if wrong.size:
            raise StreamerError(
                f"{path}: MoE layer {index} routes to expert {wrong[0]}, but the layer has "
                f"{num_experts}: the trace is of another model."
            )
        counts.append(np.bincount(ids, minlength=num_experts))
    return counts


def _npy_header(npy) -> tuple[tuple[int, ...], np.dtype]:
    """An .npy member's shape and dtype, from its header alone."""
    if np.lib.format.read_magic(npy) == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(npy)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(npy)
    return shape, dtype


def _check_routed(
    path: Path, shape: tuple[int, ...], dtype: np.dtype, stored: int, layers: list[int]
) -> None:
    """Refuse a trace that is not integer [tokens, moe_layers, top_k] ids, or whose header
    declares more ids than its member holds (numpy would allocate them all first)."""
    if len(shape) != 3 or shape[1] != len(layers) or not np.issubdtype(dtype, np.integer):
        raise StreamerError(
            f"{path}: the trace's experts are {dtype} {list(shape)}, expected "
            f"integer [tokens, {len(layers)}, top_k] for this model's {len(layers)} MoE layers."
        )
    if math.prod(shape) * dtype.itemsize > stored:
        raise StreamerError(
            f"{path}: the trace's header declares {math.prod(shape)} routed ids, more than its "
            f"{stored} bytes hold: the file is damaged; write it again with "
            "tools/routing_summary.py --trace."
        )


def parse_shard(text: str) -> tuple[int, int]:
    """ "r/N" -> (r, N), with 0 <= r < N."""
    rank, _, ranks = text.partition("/")
    try:
        r, n = int(rank), int(ranks)
    except ValueError:
        r, n = -1, 0
    if not 0 <= r < n:
        raise StreamerError(f"--shard {text!r}: give RANK/RANKS with 0 <= RANK < RANKS, e.g. 0/2.")
    return r, n
