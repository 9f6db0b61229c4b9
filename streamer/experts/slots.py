"""Compute mode on a slot pool (cache/slot_pool.py): the only expert memory the kernels are given.

One host sync learns the routing; the routed experts are placed in the pool (hits cost nothing,
misses are read into their slots), and mlx-lm's own container then runs on the pool's arrays with
slot indices, so its kernels compute exactly what they compute on the resident stacked tensors.
Nothing the compute sees views a file (on CUDA the files are mapped for the copy engine and the
gather kernel below, never for an MLX array). Slot indices are gathered on the device from a
per-layer slot table, rebuilt only after a call missed: a call that hits uploads nothing.

On the CPU backend (`overlapped_routes`) a decode-sized call (at most OVERLAPPED_ROUTES routed
entries) with hits and misses computes in two parts: its hits' entries are queued (async_eval)
once the pool has chosen the misses' slots, so they compute beside the reads; the misses' follow,
and the outputs go back in routed order, each entry exactly as in one call. Squeezed it was
1.01-1.19x the speed of reading first; page cache warm, noise around 1.0. Prompts stay one call.
A call that routes more experts than the pool has slots (a long prompt chunk on a small pool)
runs in rounds of at most `slots` experts; one whose experts lie in several chunks of the pool
computes once per chunk. On the CPU each compute takes only its own experts' entries; on a GPU,
where such a part's kernels differ from the whole call's in the last digit, the chunks' experts
are taken into one stack (up to STACK_BYTES) and each round computes every entry, keeping its own.
So that a decode call's experts lie in one chunk, a budget past one chunk is given to groups of
consecutive layers, a pool of at most one chunk each; only a layer whose own share is larger (or
budget 0 on CUDA: one layer's experts shared by all) has a pool of several chunks. Where the compute
dtype differs from the stored one (the CPU backend with bf16 scales) the routed slots are taken
and converted per call (bytes_copied); on a GPU nothing is (but the gathered stacks, below).

On CUDA with the layer's files locked whole and mapped (cache/landing.py, "gathered"), a decode
call never syncs: the GPU gathers its routed experts from the slots or the files (kernel:
io/cuda_gather.py), a prompt's a row per expert of its layer; the pool learns the routing later.
"""

from __future__ import annotations

import time
from functools import partial

import mlx.core as mx
import numpy as np

from ..cache.slot_pool import SlotPool
from ..expert_traffic import ExpertTraffic
from ..io.compute_backend import backend
from .routing import finish, host_routing, in_routed_order, kept, routed_rows

OVERLAPPED_ROUTES = 64  # calls of at most this many routed entries compute hits beside reads
GATHERED_ROUTES = 64  # routed entries a gathered call takes at most: a stack of 64 experts
# A prompt's call gathers a row per expert of its layer (no sync; the bus moves the routed experts
# without a slot): faster than a synced prompt on an H100 (bench/findings.md, "Whole-layer").
WHOLE_PROMPTS = True
STACK_BYTES = 1 << 30  # the most one stack takes: a prompt gathered whole, a call across chunks


def stack_bytes() -> int:
    """STACK_BYTES on a GPU; 0 on the CPU backend, where parts are exact and copy nothing."""
    return 0 if backend() == "cpu" else STACK_BYTES


def overlapped_routes() -> int:
    """OVERLAPPED_ROUTES on the CPU backend (exact for every family, faster squeezed); 0 on a
    GPU: parts were not the resident's to the bit on an H100 (bench/findings.md)."""
    return OVERLAPPED_ROUTES if backend() == "cpu" else 0


class Slots:
    def __init__(self, pool: SlotPool):
        self._pool = pool
        self._overlapped, self._stack_bytes = overlapped_routes(), stack_bytes()  # by backend
        self._installed: int | None = None  # the chunk whose arrays the container holds now
        self._table: mx.array | None = None  # the slot of each of the layer's experts
        self._slot_of: np.ndarray | None = None  # the same on the host
        self._version = -1  # the pool's version when the table was made
        self._rows: dict = {}  # gathered: a decode stack's positions, by shape

    def __call__(self, layer, x: mx.array, indices: mx.array, traffic: ExpertTraffic) -> mx.array:
        start = time.perf_counter()
        gather = self._gather(layer, indices)
        if gather is not None:
            out = self._gathered(layer, x, indices, traffic, *gather)
            return finish(layer, out, traffic, start)
        routed, experts = host_routing(layer, indices, traffic)
        experts = np.array(experts, dtype=np.int64)
        pool = self._pool
        if len(experts) <= pool.slots and len(pool.chunks) == 1 and not layer.converts:
            # a decode call, and most prompt chunks: one round on one chunk, every routed
            # expert placed, its slot gathered on the device from the layer's table
            hits: list = []  # the hits' part, when it computes beside the misses' reads
            early = None
            if routed.size <= self._overlapped:
                early = partial(self._hits_first, layer, x, routed, experts, hits, traffic)
            if self._place(layer, experts, traffic, early)[1] or self._table is None:
                self._new_table(layer)
            if hits:
                out = self._after_hits(layer, x, routed, hits[0], traffic)
            else:
                out = self._on_pool(layer, x, mx.take(self._table, indices), 0)
            pool.computed(out)
            return finish(layer, out, traffic, start)
        self._table = None  # rounds move slots without it
        return finish(layer, self._rounds(layer, x, routed, experts, traffic), traffic, start)

    def _rounds(self, layer, x, routed: np.ndarray, experts: np.ndarray, traffic) -> mx.array:
        """A call routing more experts than the pool has slots, or whose experts lie in several
        chunks, or that converts: rounds of at most `slots` experts, each read once for the call.
        A round computes on its chunk, on one stack of its chunks (up to STACK_BYTES) or per chunk,
        each compute registered with the pool before the next round's reads (the reuse rule). The
        CPU's way computes only the compute's own entries, put back in routed order; a GPU's, in
        rounds, every entry (the rest on any row, dropped), exact there at rounds x the call's
        compute: only at budgets below one call's experts. A call of one compute: as it came."""
        pool, flat = self._pool, routed.reshape(-1)
        masked = bool(self._stack_bytes) and len(experts) > pool.slots  # parts aren't exact
        out, outs, entries = None, [], []
        for lo in range(0, len(experts), pool.slots):
            group = experts[lo : lo + pool.slots]
            slots, _ = self._place(layer, group, traffic)
            stacked = len(group) * pool.slot_bytes <= self._stack_bytes  # one compute: a stack
            chunks = np.zeros_like(slots) if stacked else slots // pool.chunk_slots
            for own in (chunks == chunk for chunk in np.unique(chunks)):
                if masked or (own.all() and len(group) == len(experts)):  # every entry
                    whole = self._compute(layer, x, routed, group[own], slots[own], traffic)
                    pool.computed(whole)
                    out = whole if out is None else kept(routed, group[own], whole, out)
                    continue
                mine = np.flatnonzero(np.isin(flat, group[own]))
                outs.append(self._entries(layer, x, routed, mine, group[own], slots[own], traffic))
                entries.append(mine)
        return in_routed_order(routed, entries, outs) if out is None else out

    def _entries(self, layer, x, routed, mine, group, slots, traffic) -> mx.array:
        """The container on routed entries `mine` only (flat positions in `routed`, each with
        its token's row of `x`), all of them experts of `group` at `slots` (of one chunk);
        [len(mine), hidden], registered with the pool (no slot it reads is rewritten first)."""
        tokens = mx.array((mine // routed.shape[-1]).astype(np.uint32))
        taken = mx.take(x.reshape(-1, x.shape[-1]), tokens, 0)[None]
        indices = routed.reshape(-1)[mine][None, :, None]
        part = self._compute(layer, taken, indices, group, slots, traffic)
        self._pool.computed(part)
        return part.reshape(len(mine), -1)

    def _hits_first(self, layer, x, routed, experts, hits: list, traffic, slots, missed) -> None:
        """Called by the pool between choosing slots and reading the misses: the hits' routed
        entries queued (async_eval) to compute beside the reads; kept in `hits`, with the rest."""
        if missed.all():
            return
        hit = ~missed
        mine = np.flatnonzero(np.isin(routed.reshape(-1), experts[hit]))
        part = self._entries(layer, x, routed, mine, experts[hit], slots[hit], traffic)
        mx.async_eval(part)
        hits.append((mine, part, experts[missed], slots[missed]))

    def _after_hits(self, layer, x, routed, hits: tuple, traffic) -> mx.array:
        """The entries `_hits_first` left (the misses', read now), then every entry's output in
        routed order, as the container computes on all of them at once."""
        done, part, misses, rows = hits
        rest = np.setdiff1d(np.arange(routed.size), done)
        late = self._entries(layer, x, routed, rest, misses, rows, traffic)
        return in_routed_order(routed, [done, rest], [part, late])

    def _new_table(self, layer, gathered: bool = False) -> None:
        """The layer's slots on the host and for the kernels (-1: NO_SLOT, never gathered): its
        own upload after a synced call moved slots, a view of the pool's for gathered calls."""
        pool, base = self._pool, self._pool.base[layer.index]
        self._slot_of = pool.policy.slot_of[base : base + layer.num_experts].copy()
        if gathered:
            self._table = pool.gathered_table(layer.index)
        else:
            self._table = mx.array(self._slot_of.astype(np.uint32))
        self._version = pool.version

    def _gather(self, layer, indices: mx.array) -> tuple | None:
        """The pool's (kernel, sources) for this call and whether it gathers whole, if it may
        run without a sync: nothing converted, no one waiting for the routing on the host (a
        trace, a profile, a verify pass), and a decode-sized call (at most GATHERED_ROUTES
        entries, no more than the pool's slots) or, WHOLE_PROMPTS, one with an entry per expert
        of the layer or more, all of whose experts fit the pool and, as one stack, STACK_BYTES."""
        pool, stats = self._pool, layer.stats
        small = indices.size <= min(GATHERED_ROUTES, pool.slots)
        whole = WHOLE_PROMPTS and layer.num_experts <= min(indices.size, pool.slots)
        whole = whole and layer.num_experts * pool.slot_bytes <= STACK_BYTES
        if not (small or whole) or layer.converts or stats.wants_routing:
            return None
        source = None if stats.verifying is not None else pool.gather_source(layer.index)
        return None if source is None else (*source, not small)

    def _gathered(self, layer, x, indices, traffic, kernel, sources, whole: bool) -> mx.array:
        """The container on the stack the GPU gathered (io/cuda_gather.py): no sync, no read. A
        decode call's stack holds its routed entries; a prompt's a row per expert of the layer
        (those it routes written), on which the container computes as on the resident weights."""
        pool = self._pool
        traffic.gathered += 1
        settled = time.perf_counter()
        pool.settle_earlier_tokens()
        traffic.read_seconds += time.perf_counter() - settled
        if self._version != pool.version or self._table is None:
            self._new_table(layer, gathered=True)
        if whole:  # rows: the layer's experts, those the prompt does not route left unwritten
            rows, position = routed_rows(indices, layer.num_experts), indices
        else:  # rows: the routed entries
            shape = indices.shape
            if shape not in self._rows:
                self._rows[shape] = mx.arange(indices.size, dtype=mx.uint32).reshape(shape)
            rows, position = indices, self._rows[shape]
            traffic.bytes_copied += indices.size * pool.slot_bytes  # a prompt's: at its settle
        out = self._on_stack(layer, kernel(rows, self._table, sources, pool.arrays), x, position)
        pool.computed(out)
        count = partial(traffic.count_gathered, self._slot_of, pool.slot_bytes, whole)
        pool.defer(layer.index, indices, count, prompt=whole)
        layer.stats.settle_before_reading(pool.settle)
        return out

    def _place(
        self, layer, group: np.ndarray, traffic: ExpertTraffic, while_reading=None
    ) -> tuple[np.ndarray, int]:
        """`group`'s experts placed in the pool (misses read), counted; their slots, misses.
        `while_reading`: SlotPool.place's."""
        pool, placed = self._pool, time.perf_counter()
        slots, misses = pool.place(layer.index, group, while_reading)
        placed = time.perf_counter() - placed
        traffic.read_seconds += placed
        traffic.miss_seconds += placed if misses else 0.0  # the rest: the fence and LFU alone
        traffic.count_slots(len(group) - misses, misses, pool.slot_bytes)
        if layer.stats.verifying is not None:
            layer.stats.verifying[-1].hits.update(group[~pool.last_missed].tolist())
        return slots, misses

    def _on_pool(self, layer, x: mx.array, position: mx.array, chunk: int) -> mx.array:
        """The container on chunk `chunk`'s arrays themselves (installed once, not per call:
        nothing else installs into a slot layer's container), the routed entries at `position`
        (rows of that chunk)."""
        if self._installed != chunk:
            layer.install(self._pool.chunks[chunk])
            self._installed = chunk
        return layer.compute(x, position)

    def _compute(self, layer, x, routed: np.ndarray, group, slots, traffic) -> mx.array:
        """The container for `group`'s experts at `slots` (x: the tokens' rows, `routed` their
        experts): on the pool's chunk itself when they lie in one and nothing converts, else on
        one stack of them taken from their chunks (converted; counted as bytes_copied)."""
        pool = self._pool
        chunks, rows = np.divmod(slots, pool.chunk_slots)
        position = np.zeros(layer.num_experts, dtype=np.uint32)  # outside the group: any row
        if not layer.converts and np.all(chunks == chunks[0]):  # the kernels gather the slots
            position[group] = rows
            return self._on_pool(layer, x, mx.array(position[routed]), int(chunks[0]))
        order = np.argsort(chunks, kind="stable")  # the stack's rows: experts by chunk
        takes = [(c, mx.array(rows[order][chunks[order] == c])) for c in np.unique(chunks)]
        parts = [[mx.take(a, taken, axis=0) for a in pool.chunks[c]] for c, taken in takes]
        # one chunk (a call that converts): its takes as they are, no second copy
        tensors = [layer.convert(t[0] if len(t) == 1 else mx.concatenate(t)) for t in zip(*parts)]
        traffic.bytes_copied += sum(t.nbytes for t in tensors)
        position[group[order]] = np.arange(len(group))
        return self._on_stack(layer, tensors, x, mx.array(position[routed]))

    def _on_stack(self, layer, tensors: list[mx.array], x, position: mx.array) -> mx.array:
        """The container on a stack, then the first chunk again (kept, every layer's stack would
        stay: Kimi K2, 10 GB); none named installed meanwhile, whatever stops the call."""
        self._installed = None
        layer.install(tensors)
        out = layer.compute(x, position)
        layer.install(self._pool.chunks[0])
        self._installed = 0
        return out
