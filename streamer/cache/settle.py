"""Gathered calls' routing given to their slot pool later, and the kernel they are gathered by
(SlotPool.gather_source, defer and settle use these).

Gathered calls (CUDA, files locked whole and mapped: `gather_source`) read no slot on the host:
the GPU takes each routed expert from its slot or, a miss, from the file (io/cuda_gather.py),
and the call's routing is only recorded (`defer`, `Deferred`). A settle gives the policy those
routings in order and lets it refresh the slots (SlotLFU.refresh: a miss was read from the file,
so it need not take a slot, and only experts routed more often than the ones they displace do),
and copies each expert that ends with a new slot into it (one fill kernel on MLX's stream, from
the pinned files: io/cuda_gather.py SlotFill). Against giving each call's misses slots as
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
from .slot_memory import LayerSource, SlotTensor

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
    """Each call's distinct routed experts (sorted), on the host in one pull (`pulled`)."""
    if not routed:
        return []
    calls = pulled(routed)
    if isinstance(calls, np.ndarray):  # decode: a row a call
        rows = np.sort(calls, axis=1)  # a token's k experts are distinct: nothing to drop
        if (rows[:, 1:] != rows[:, :-1]).all():
            return list(rows)
    return [np.unique(experts) for experts in calls]


def pulled(routed: Sequence[mx.array]) -> np.ndarray | list[np.ndarray]:
    """Each call's routed experts in routed order, flat, on the host in one pull for all of them
    (each np.array of a GPU array is a sync of its own), on `pull_stream()`: calls of one shape
    (decode: [1, 1, k] a call) as the rows of one array."""
    stream = pull_stream()
    if len({indices.shape for indices in routed}) == 1:
        return np.array(mx.concatenate(list(routed), stream=stream)).reshape(len(routed), -1)
    flat = [mx.reshape(indices, (-1,), stream=stream) for indices in routed]
    together = np.array(mx.concatenate(flat, stream=stream))
    return np.split(together, np.cumsum([indices.size for indices in routed])[:-1])


_pull_streams: dict[str, mx.Stream] = {}  # device -> the pull's stream there


def pull_stream() -> mx.Stream:
    """Where a settle's pull joins the calls' routings: on a GPU a stream of its own there. The
    routings are device buffers (CUDA), and the CPU's stream would move each one to managed
    memory before reading it (an allocation and a copy per call, 768 a settle at 48 layers);
    the GPU's own stream would queue the join behind every kernel there, the last token's
    too. A second stream waits only for the calls' own kernels, and the host then pulls one
    buffer. On the CPU backend, the CPU's stream."""
    device = mx.default_device()
    if device == mx.cpu:
        return mx.cpu
    key = str(device)
    if key not in _pull_streams:
        _pull_streams[key] = mx.new_stream(device)
    return _pull_streams[key]


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


def gather_kernel(tensors: Sequence[SlotTensor], source: LayerSource, bases: list[int]) -> tuple:
    """The gather kernel for a layer whose file `f` kernels reach at `bases[f]`, and the device
    address of expert 0's bytes and the stride of each tensor (uint64 [tensors, 2], numpy)."""
    from ..io.cuda_gather import ExpertGather

    at = source.placements
    sources = np.array([[bases[a.file] + a.offset, a.stride] for a in at], dtype=np.uint64)
    alignment = int(np.gcd.reduce(sources.ravel().astype(np.int64)))
    return ExpertGather(tensors, alignment), sources


# A gathered layer's moved experts copied by one kernel on MLX's stream (`Gathered.fill`) instead
# of the landing's copy-engine calls and a host wait: on an H100, medium routing at 25%, steady
# decode 51.1-51.4 tok/s against 45.8-46.4, tokens mlx-lm's (bench/findings.md). False: the old
# way (`bash bench/cuda_goals.sh variant OUT copies "from streamer.cache import settle;
# settle.FILL_ON_GPU = False" PROFILE` measures both).
FILL_ON_GPU = True


class Gathered:
    """A pool's gathered layers: per layer its gather kernel and sources (`source`), and the
    settle's copies for them (`fill`): one fill kernel (io/cuda_gather.py SlotFill) queued on
    MLX's stream, after every reader of the old slots (queued first: MLX's CUDA backend runs
    each evaluation's graph on one stream, in order) and before any kernel queued later (a
    gathered call on the new table). The host does not wait; the pool's next fence does, on the
    output `fill` returns. Nothing can fail a read there: the files are locked whole and the
    kernel reads their pages (a gathered layer keeps no checksum: SlotPool.gather_source)."""

    def __init__(self, tensors: Sequence[SlotTensor]):
        self.tensors = tuple(tensors)
        self._kernels: dict[int, tuple | None] = {}  # layer -> (kernel, sources) or None
        self._sources: dict[int, np.ndarray] = {}  # gathered layer -> its sources, on the host
        self._fill = None
        self._table: tuple[int, mx.array | None] = (-1, None)  # `table`'s version, table

    def source(self, layer: int, source: LayerSource, landing) -> tuple | None:
        """(kernel, sources) for `layer` when `landing` lets kernels read every file of
        `source` (its `device_address`); else None. Decided once per layer."""
        if layer not in self._kernels:
            self._kernels[layer] = None
            if getattr(landing, "gathers", False):
                bases = [landing.device_address(file) for file in source.files]
                if None not in bases:
                    kernel, self._sources[layer] = gather_kernel(self.tensors, source, bases)
                    self._kernels[layer] = kernel, mx.array(self._sources[layer])
        return self._kernels[layer]

    def table(self, version: int, slot_of: np.ndarray) -> mx.array:
        """Every key's slot (uint32, -1: none) as the gather kernels take it, uploaded once a
        pool `version`: a settle moves slots of every layer at once, and on an H100 an upload
        from the host took ~0.5 ms (bench/findings.md), 48 a settle when each layer made its own."""
        if self._table[0] != version:
            self._table = (version, mx.array(slot_of.astype(np.uint32)))
        return self._table[1]

    def covers(self, reads: dict[int, list[tuple[int, int]]]) -> bool:
        """Whether `fill` copies `reads`: every layer's kernels were made (`source`)."""
        return FILL_ON_GPU and self._sources.keys() >= reads.keys()

    def fill(self, reads: dict[int, list[tuple[int, int]]], arrays: Sequence[mx.array]):
        """`reads` (layer -> (expert, slot) list) copied into the pool's `arrays`; the kernel's
        output, queued (mx.async_eval)."""
        from ..io.cuda_gather import SlotFill

        if self._fill is None:
            self._fill = SlotFill(self.tensors)
        done = self._fill(*fill_addresses(self._sources, reads), arrays)
        mx.async_eval(done)
        return done


def fill_addresses(
    sources: dict[int, np.ndarray], reads: dict[int, list[tuple[int, int]]]
) -> tuple[np.ndarray, np.ndarray]:
    """The slots of `reads` (layer -> (expert, slot) list) and each read's tensors' device
    addresses (uint64 [reads, tensors]) from its layer's `sources` (gather_kernel's)."""
    experts, slots, layers = [], [], []
    for layer, layer_reads in reads.items():
        for expert, slot in layer_reads:
            experts.append(expert)
            slots.append(slot)
            layers.append(sources[layer])
    first, stride = np.stack(layers).transpose(2, 0, 1)  # each [reads, tensors]
    return np.array(slots, dtype=np.uint32), first + np.array(experts, np.uint64)[:, None] * stride
