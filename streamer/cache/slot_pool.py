"""A bounded pool of expert slots: the only expert memory a GPU kernel is given on the slot path.

Experts of one shape class (every MoE layer of a model, or a group of them: experts/slots.py)
share a pool of S slots, allocated once, untouched, in chunks: per chunk one MLX array
`[chunk slots, *shape]` per tensor, 16 KiB aligned, of at most CHUNK_BYTES (MLX refuses a
dimension past 2^31, Metal a buffer past maxBufferLength). A call's hits cost nothing, its misses
are read from the expert file into their slots (several in flight); the kernels run on the chunks
with slot indices. Victims: LFU with aging, never the call's own. Reads land where `landing` says:
in the slot on Metal and the CPU; on CUDA the copy engine writes it, or a gathered layer's fill
kernel does (cache/settle.py: gathered calls come later).

The reuse rule (kernels run asynchronously, and MLX lazily): a slot is rewritten only after every
kernel that reads it has run: `fence()` evaluates the outputs computed from the pool (`computed`)
first, or a settle's fill is queued after them (async_eval).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext

import mlx.core as mx
import numpy as np

from ..io.pinning import PinAllowance
from ..io.reads import DIRECT_ALIGN, MAX_GAP, Read, finish_all, plan_reads, split
from .landing import CUDA_MISSES_DEFAULT, Landing, copy_mapped, landing_for, unreadable
from .policies import SlotLFU
from .settle import Deferred, Gathered, counted, replay
from .slot_memory import LayerSource, SlotTensor, aligned_host, allocate, chunk_slots

READERS = 8  # reads in flight at once (threads: preadv releases the GIL)
PIECE = 1 << 19  # bytes of one read at most: a 2.65 MB expert is read by 6 threads
# The most bytes one array of a pool holds: far below any Mac's maxBufferLength, large enough
# that a decode call's experts lie in one chunk (experts/slots.py: a pool per group of layers).
CHUNK_BYTES = 1 << 30
_readers = ThreadPoolExecutor(READERS, thread_name_prefix="streamer-read")


class SlotPool:
    def __init__(
        self,
        tensors: Sequence[SlotTensor],
        slots: int,
        layers: dict[int, LayerSource],
        chunk_bytes: int | None = CHUNK_BYTES,
        landing: Landing | None = None,
        cuda_misses: str = CUDA_MISSES_DEFAULT,
        pinnable: PinAllowance | None = None,
    ):
        """`landing`: None reads into the slots, except on CUDA (`landing_for`: `cuda_misses`,
        whole files page-locked while `pinnable`, the load's, allows; None: none)."""
        self.tensors, self.slots, self.layers = tuple(tensors), slots, layers
        firsts = np.cumsum([0, *(layer.num_experts for layer in layers.values())]).tolist()
        self.base = dict(zip(layers, firsts))  # layer index -> its first key (keys: base + expert)
        self.policy = SlotLFU(slots, firsts[-1])
        self.chunk_slots = chunk_slots(self.tensors, slots, chunk_bytes)
        # per chunk, per tensor: MLX [chunk slots, *shape] and host uint8 [chunk slots, nbytes]
        self.chunks: list[list[mx.array]] = []
        self._rows: list[list[np.ndarray]] = []
        for first in range(0, slots, self.chunk_slots):
            made = [allocate(min(self.chunk_slots, slots - first), t) for t in self.tensors]
            self.chunks.append([array for array, _ in made])
            self._rows.append([rows for _, rows in made])
        self._scratch = aligned_host(max(MAX_GAP, DIRECT_ALIGN))  # padding between tensors
        self._pending: list[mx.array] = []
        self._queued = None  # the array `_queue_pending` left in `_pending`
        self._deferred = Deferred(calls_per_token=len(layers))  # gathered calls' routings
        self._gathered = Gathered(self.tensors)  # their kernels, per layer, and the settle's
        self.version = 0  # changes whenever a slot gets another expert
        self.settled = 0  # experts settles wrote into slots (their bytes cross the bus on CUDA)
        self._filled: list[int] = []  # slots read since `_unread_emptied` began
        self.last_missed = np.zeros(0, dtype=bool)
        self.slot_bytes = sum(t.nbytes for t in self.tensors)
        self.nbytes = slots * self.slot_bytes
        cached = all(f.direct_fd is None for source in layers.values() for f in source.files)
        self._landing = landing or landing_for(self.tensors, READERS, cached, cuda_misses, pinnable)

    @property
    def arrays(self) -> list[mx.array]:
        """The pool's arrays, one per tensor, slot s at row s: a pool of one chunk."""
        (arrays,) = self.chunks
        return arrays

    def place(
        self, layer: int, experts: np.ndarray, while_reading: Callable | None = None
    ) -> tuple[np.ndarray, int]:
        """Slots holding `experts` of `layer` (distinct, at most `slots`), misses read into
        them: (slot per expert, misses read). `while_reading(slots, missed)` runs once the slots
        are chosen, before any read: it may queue kernels on the hits' slots."""
        self.settle()
        self.fence()  # the reuse rule, on every call (in decode free: the router sync waited)
        with self._unread_emptied():
            slots, miss = self.policy.assign(self.base[layer] + experts)
            self.last_missed = miss  # which of `experts` were read (a verify pass counts waste)
            misses = int(np.count_nonzero(miss))
            if misses:
                self.version += 1
                self._deferred.moved()
                if while_reading is not None:
                    while_reading(slots, miss)
                reads = [(int(e), int(s)) for e, s in zip(experts[miss], slots[miss])]
                self._read_misses(layer, reads)
        return slots, misses

    @contextmanager
    def _unread_emptied(self) -> Iterator[None]:
        """The policy's moves inside, kept only for the slots `_read_misses` filled: on any
        failure, a Ctrl-C wherever it lands included, a slot given an expert it has not read is
        emptied (else the next call would compute with the bytes of the expert it held)."""
        before, self._filled = self.policy.slot_key.copy(), []
        try:
            yield
        except BaseException:
            moved = np.flatnonzero(self.policy.slot_key != before)
            self.policy.empty(np.setdiff1d(moved, self._filled))
            raise

    def _is_gathered(self, layer: int, expert: int) -> bool:  # maps files: a read's error
        try:
            return self.gather_source(layer) is not None
        except OSError as e:
            raise unreadable(self.layers[layer].where(0), expert, e) from e

    def gathered_table(self, layer: int) -> mx.array:
        """`layer`'s slot of each expert for gathered calls (a view of the pool's whole table)."""
        base = self.base[layer]
        table = self._gathered.table(self.version, self.policy.slot_of)
        return table[base : base + self.layers[layer].num_experts]

    def gather_source(self, layer: int) -> tuple | None:
        """(kernel, sources) for gathered calls of `layer` (io/cuda_gather.py) when kernels may
        read its files (locked whole), the pool is one chunk and no read is checked."""
        source = self.layers[layer]
        one_chunk_unchecked = len(self.chunks) == 1 and not source.checksums
        return self._gathered.source(layer, source, self._landing if one_chunk_unchecked else None)

    def defer(self, layer: int, indices: mx.array, count: Callable, prompt: bool = False) -> None:
        """A gathered call of `layer` routed `indices`: the policy learns it, `count` counts it."""
        self._deferred.add(layer, indices, count, prompt)

    def settle_earlier_tokens(self) -> None:
        """At a gathered call, when due: `settle` every token's calls but the last's (mlx-lm
        waited for those: the pull waits for nothing, the replay runs beside the GPU)."""
        if self._deferred.due():
            self.settle(behind=len(self.layers))

    def settle(self, behind: int = 0) -> None:
        """The deferred routings (but the last `behind` calls') given to the policy in order
        (settle.replay); each expert that ended with a new slot read into it, by one fill kernel
        queued after the old slots' readers, else after the fence. A failure leaves no slot
        claiming an expert it does not hold."""
        deferred = self._deferred.take(behind)
        if not deferred:
            return
        with self._unread_emptied():
            self._settle(deferred)

    def _settle(self, deferred: list) -> None:
        routed = counted(deferred)
        reads = replay(self.policy, self.base, [(d[0], r) for d, r in zip(deferred, routed)])
        if not reads:
            return self._queue_pending()  # else each gathered call's output stays listed
        self.version, self.settled = self.version + 1, self.settled + sum(map(len, reads.values()))
        if self._gathered.covers(reads):
            mx.async_eval(self._pending)  # queued before the fill: the stream runs them first
            self._pending = [self._gathered.fill(reads, self.arrays)]  # done after all of them
            return
        self.fence()
        for layer, layer_reads in reads.items():
            self._read_misses(layer, layer_reads)

    def computed(self, output: mx.array) -> None:
        """An output whose graph reads the pool: the next write waits until it is computed."""
        self._pending.append(output)

    def _queue_pending(self) -> None:
        """The pending outputs queued (async_eval), listed as one array that waits for them."""
        if self._pending and not (len(self._pending) == 1 and self._pending[0] is self._queued):
            (self._queued,) = mx.depends([mx.zeros((1,), mx.uint8)], self._pending)
            mx.async_eval(self._queued)
            self._pending = [self._queued]

    def fence(self) -> None:
        if self._pending:
            mx.eval(self._pending)  # returns once the kernels have run (Metal, CUDA) or computed
            self._pending.clear()

    def _read_misses(self, layer: int, reads: list[tuple[int, int]]) -> None:
        """Read each (expert, slot) of `layer`, as many experts at once as the landing lends
        buffers (READERS into the slots themselves), in pieces of at most PIECE bytes shared by
        the reader threads (a lone miss read by several); a gathered layer's by the fill kernel
        (settle.Gathered). Each slot read and checked is listed in `_filled`: on a failure
        `_unread_emptied` empties the rest, none is left half read."""
        at_once = READERS if self._landing is None else self._landing.buffers
        source = self.layers[layer]
        if self._is_gathered(layer, reads[0][0]) and self._gathered.covers({layer: reads}):
            self.computed(self._gathered.fill({layer: reads}, self.arrays))
            self._filled.extend(slot for _, slot in reads)
            return
        if self._landing is not None and self._landing.reads_files:
            copied = copy_mapped(self._landing, source, self.tensors, reads, self._slot_rows)
            for (expert, _), sources in zip(reads, copied):
                source.check(self.tensors, expert, sources)
            self._filled.extend(slot for _, slot in reads)
            return
        for lo in range(0, len(reads), at_once):
            wave = reads[lo : lo + at_once]
            with ExitStack() as stack:
                landed = [stack.enter_context(self._land(slot)) for _, slot in wave]
                pieces = [
                    (expert, piece)
                    for (expert, _), buffers in zip(wave, landed)
                    for piece in self._pieces(layer, expert, buffers)
                ]
                if len(pieces) == 1:
                    self._read_piece(layer, *pieces[0])
                else:  # every piece finishes before a buffer is lent again, failed or not
                    finish_all([_readers.submit(self._read_piece, layer, *p) for p in pieces])
                for (expert, _), buffers in zip(wave, landed):
                    source.check(self.tensors, expert, buffers)
            self._filled.extend(slot for _, slot in wave)

    def _land(self, slot: int) -> AbstractContextManager[Sequence[np.ndarray]]:
        rows = self._slot_rows(slot)
        return nullcontext(rows) if self._landing is None else self._landing.into(rows)

    def _slot_rows(self, slot: int) -> list[np.ndarray]:  # its host rows, a tensor each
        chunk, row = divmod(slot, self.chunk_slots)
        return [rows[row] for rows in self._rows[chunk]]

    def _pieces(self, layer: int, expert: int, buffers: Sequence[np.ndarray]) -> list[Read]:
        spans = [
            (at.file, at.offset + expert * at.stride, buffer)
            for at, buffer in zip(self.layers[layer].placements, buffers)
        ]
        return [piece for read in plan_reads(spans, self._scratch) for piece in split(read, PIECE)]

    def _read_piece(self, layer: int, expert: int, piece: Read) -> None:
        source = self.layers[layer]
        file, offset, parts = piece
        try:
            source.files[file].preadv(offset, parts)
        except OSError as e:
            raise unreadable(source.where(file), expert, e) from e

    def close(self) -> None:
        self.fence()
        counted(self._deferred.take(behind=0))  # not replayed: no slot is written once closed
        if self._landing is not None:
            self._landing.close()
            self._landing = None
        for file in (file for layer in self.layers.values() for file in layer.files):
            file.close()
