"""Gathered calls' routing given to their slot pool later (SlotPool.defer and settle use these).

Gathered calls (CUDA, files locked whole and mapped: `gather_source`) read no slot on the host:
the GPU takes each routed expert from its slot or, a miss, from the file (io/cuda_gather.py),
and the call's routing is only recorded (`defer`, `Deferred`). A settle gives the policy those
routings in order and lets it refresh the slots (SlotLFU.refresh: a miss was read from the file,
so it need not take a slot, and only experts routed more often than the ones they displace do),
and copies each expert that ends with a new slot into it (one fill kernel, from the pinned files:
cache/gathered.py). Against giving each call's misses slots as
`place` does, this copies 6-40% fewer experts for as many misses, and the host counts a
settle's calls instead of choosing victims for each (bench/settle_copies.py). It
comes every SETTLE_TOKENS tokens' worth of calls (after a synced call moved slots, a prompt, 1,
2, 4, ... tokens first: until a settle, a missed expert misses again on every call routing it;
bench/settle_interval.py), at a token's first call and for the tokens before the last one,
which the GPU has computed: so nothing waits for the GPU, and the host replays while the GPU
computes the last token (SlotPool.settle_earlier_tokens); and before any `place`, for all.
`version` changes whenever a slot's expert does: a gathered call trusts its slot table, so it
makes a new one then.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np

from .policies import SlotLFU

SETTLE_TOKENS = 16  # gathered tokens between two settles (after slots moved: 1, 2, 4, ... first)


class Deferred:
    """Gathered calls not yet settled, in order: (layer, routed indices, what counts their
    distinct experts); and when the next settle is due."""

    def __init__(self, calls_per_token: int):
        self.calls: list[tuple[int, mx.array, Callable[[np.ndarray], None]]] = []
        self._per_token = calls_per_token  # one per layer of the pool
        self._tokens = SETTLE_TOKENS  # tokens' worth of calls the next settle waits for

    def add(self, layer: int, indices: mx.array, count: Callable, prompt: bool) -> None:
        """A gathered call deferred; after a `prompt`'s the settles come sooner (`moved`): the
        pool is to hold what the first tokens route."""
        self.calls.append((layer, indices, count))
        if prompt:
            self.moved()

    def moved(self) -> None:
        """A synced call moved slots: settle after 1 token, then 2, 4, ... (until a settle, an
        expert that missed misses again on every call routing it)."""
        self._tokens = 1

    def due(self) -> bool:
        """Whether the calls before the last token's are the next settle's worth."""
        return len(self.calls) - self._per_token >= self._tokens * self._per_token

    def take(self, behind: int) -> list:
        """Every call but the last `behind`, no longer deferred."""
        cut = max(0, len(self.calls) - behind)
        taken, self.calls = self.calls[:cut], self.calls[cut:]
        if taken:
            self._tokens = min(2 * self._tokens, SETTLE_TOKENS)
        return taken


def distinct(routed: Sequence[mx.array]) -> list[np.ndarray]:
    """Each call's distinct routed experts (sorted), on the host in one pull for all of them
    (each np.array of a GPU array is a sync of its own), on `side_stream("pull")`."""
    if not routed:
        return []
    stream = side_stream("pull")
    if len({indices.shape for indices in routed}) == 1:  # decode: [1, 1, k] a call
        together = np.array(mx.concatenate(list(routed), stream=stream)).reshape(len(routed), -1)
        rows = np.sort(together, axis=1)  # a token's k experts are distinct: nothing to drop
        if (rows[:, 1:] != rows[:, :-1]).all():
            return list(rows)
    flat = [mx.reshape(indices, (-1,), stream=stream) for indices in routed]
    together = np.array(mx.concatenate(flat, stream=stream))
    ends = np.cumsum([indices.size for indices in routed])
    return [np.unique(experts) for experts in np.split(together, ends[:-1])]


_side_streams: dict[tuple[str, str], mx.Stream] = {}  # (device, purpose) -> its stream there


def side_stream(purpose: str) -> mx.Stream:
    """A GPU stream of its own for `purpose` ("pull", "fill"), beside the one the model's kernels
    run on; on the CPU backend, the CPU's stream.

    "pull": a settle's join of the calls' routings. They are device buffers (CUDA), and the
    CPU's stream would move each one to managed memory before reading it (an allocation and a
    copy per call, 768 a settle at 48 layers); the model's stream would queue the join behind
    every kernel there, the last token's too. A stream of its own waits only for the calls' own
    kernels, and the host then pulls one buffer. "fill": the settle's copies (Gathered.fill)."""
    device = mx.default_device()
    if device == mx.cpu:
        return mx.cpu
    key = (str(device), purpose)
    if key not in _side_streams:
        _side_streams[key] = mx.new_stream(device)
    return _side_streams[key]


def counted(deferred: list[tuple[int, mx.array, Callable[[np.ndarray], None]]]) -> list:
    """Each deferred (layer, routed indices, count) call's distinct routed experts (`distinct`),
    given to its count."""
    routed = distinct([indices for _, indices, _ in deferred])
    for (_, _, count), experts in zip(deferred, routed):
        count(experts)
    return routed


def replay(
    policy: SlotLFU, base: dict[int, int], deferred: list[tuple[int, np.ndarray]]
) -> dict[int, list[tuple[int, int]]]:
    """`deferred` (layer, distinct routed experts) counted by `policy` in order and its slots
    refreshed (SlotLFU.refresh: the calls read their misses from the files, so none must take a
    slot); per layer (keys from `base[layer]`), the (expert, slot) of each expert that ends with
    a new slot: the reads that fill them."""
    before = policy.slot_key.copy()
    policy.refresh([base[layer] + experts for layer, experts in deferred])
    keys = policy.slot_key
    owners = sorted((first, layer) for layer, first in base.items())
    reads: dict[int, list[tuple[int, int]]] = {}
    for slot in np.flatnonzero((keys != before) & (keys >= 0)):
        key = int(keys[slot])
        first, layer = owners[bisect.bisect_right(owners, (key, float("inf"))) - 1]
        reads.setdefault(layer, []).append((key - first, int(slot)))
    return reads
