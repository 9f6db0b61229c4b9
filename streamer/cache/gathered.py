"""A slot pool's gathered layers (CUDA, files locked whole and mapped: SlotPool.gather_source):
per layer the kernel that gathers its routed experts from the slots or the files, the table of
slots those kernels read, and a settle's copies into the slots (io/cuda_gather.py's kernels).

A settle's fill runs behind the model: on a GPU stream of its own, beside the tokens after it,
on a few of the GPU's multiprocessors. The bus is idle for most of a decode token (a medium
token at 25% moves its misses in ~5 of its ~14 ms on an H100), so the copies use that time
instead of delaying the next token by all of theirs. Meanwhile the gather table gives the
experts being copied no slot (they are read from the files, as they were before the settle),
and FILL_BEHIND_TOKENS tokens later they join it; the first kernel on that table waits for the
fill (`mx.depends`), which has long ended by then. Nothing predicted or racing can change a
result: a gather reads a slot only when its table says the slot holds the expert.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from .settle import side_stream
from .slot_memory import LayerSource, SlotTensor


def gather_kernel(tensors: Sequence[SlotTensor], source: LayerSource, bases: list[int]) -> tuple:
    """The gather kernel for a layer whose file `f` kernels reach at `bases[f]`, and the device
    address of expert 0's bytes and the stride of each tensor (uint64 [tensors, 2], numpy)."""
    from ..io.cuda_gather import ExpertGather

    at = source.placements
    sources = np.array([[bases[a.file] + a.offset, a.stride] for a in at], dtype=np.uint64)
    alignment = int(np.gcd.reduce(sources.ravel().astype(np.int64)))
    return ExpertGather(tensors, alignment), sources


# A gathered layer's moved experts copied by one kernel (`Gathered.fill`) instead of the
# landing's copy-engine calls and a host wait: on an H100, medium routing at 25%, steady decode
# 51.1-51.4 tok/s against 45.8-46.4, tokens mlx-lm's (bench/findings.md). False: the old way
# (`bash bench/cuda_goals.sh variant OUT copies "from streamer.cache import gathered;
# gathered.FILL_ON_GPU = False" PROFILE` measures both).
FILL_ON_GPU = True
# A settle's fill runs behind: on a stream of its own, beside the next tokens, with FILL_BLOCKS
# blocks; its experts join the gather table FILL_BEHIND_TOKENS tokens later (until then they
# are read from the files, as before the settle). 0: the fill on the model's stream, before the
# next token's kernels, with FILL_BLOCKS_NOW blocks (as a synced call's misses are always).
FILL_BEHIND_TOKENS = 2
FILL_BLOCKS = 16  # of 132 multiprocessors on an H100
FILL_BLOCKS_NOW = 512


class Gathered:
    """A pool's gathered layers: per layer its gather kernel and sources (`source`), the table of
    slots they gather from (`table`), and the settle's copies for them (`fill`): one fill
    kernel (io/cuda_gather.py SlotFill) queued after every reader of the old slots. The host
    does not wait; the pool's next fence does, on the output `fill` returns. Nothing can fail
    a read there: the files are locked whole and the kernel reads their pages (a gathered layer
    keeps no checksum: SlotPool.gather_source)."""

    def __init__(self, tensors: Sequence[SlotTensor], calls_per_token: int):
        self.tensors = tuple(tensors)
        self._kernels: dict[int, tuple | None] = {}  # layer -> (kernel, sources) or None
        self._sources: dict[int, np.ndarray] = {}  # gathered layer -> its sources, on the host
        self._fill = None
        self._table: tuple = (-1, None, None)  # `table`'s version, table, the same on the host
        self._per_token = calls_per_token
        self._behind: list = []  # a fill behind: [done, its keys, gathered calls until it lands]
        self._landed: mx.array | None = None  # a fill behind whose slots the next table trusts

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

    def table(self, version: int, slot_of: np.ndarray) -> tuple[mx.array, np.ndarray]:
        """Every key's slot as the gather kernels take it (uint32, NO_SLOT: none) and on the
        host (-1: none), made once a pool `version`: a settle moves slots of every layer at
        once, and on an H100 an upload from the host took ~0.5 ms (bench/findings.md), 48 a
        settle when each layer made its own. Keys a fill behind is still copying have none."""
        if self._table[0] != version:
            held = slot_of.copy()
            if self._behind:
                held[self._behind[1]] = -1
            table = mx.array(held.astype(np.uint32))
            if self._landed is not None:  # the kernels on this table wait for that fill
                table, self._landed = mx.depends(table, self._landed), None
            self._table = (version, table, held)
        return self._table[1:]

    def tick(self) -> bool:
        """A gathered call is queued: whether a fill behind has had its tokens, so that its slots
        join the next table (the pool makes a new version)."""
        if not self._behind:
            return False
        self._behind[2] -= 1
        if self._behind[2] > 0:
            return False
        self._landed, self._behind = self._behind[0], []
        return True

    def covers(self, reads: dict[int, list[tuple[int, int]]]) -> bool:
        """Whether `fill` copies `reads`: every layer's kernels were made (`source`)."""
        return FILL_ON_GPU and self._sources.keys() >= reads.keys()

    def fill(
        self,
        reads: dict[int, list[tuple[int, int]]],
        arrays: Sequence[mx.array],
        base=None,
        after: Sequence[mx.array] = (),
    ) -> mx.array:
        """`reads` (layer -> (expert, slot) list) copied into the pool's `arrays`; the kernel's
        output, queued (mx.async_eval). `after`: every output queued so far that reads the pool
        (the pool's `computed`). A settle's fill (`base`: the pool's first key per layer) runs
        behind when FILL_BEHIND_TOKENS: on its own stream, after the last of `after` (the model's
        stream runs them in order), while the tokens after it gather its experts from the files;
        else, and a synced call's, on the model's stream, after `after` and before anything
        queued later."""
        from ..io.cuda_gather import SlotFill

        if self._fill is None:
            self._fill = SlotFill(self.tensors)
        slots, addresses = fill_addresses(self._sources, reads)
        if base is None or not FILL_BEHIND_TOKENS:
            mx.async_eval(list(after))
            done = self._fill(mx.array(slots), addresses, arrays, FILL_BLOCKS_NOW)
        else:
            if self._behind:  # one still behind: the next table waits for it
                self._landed = self._behind[0]
            keys = [base[layer] + expert for layer, moves in reads.items() for expert, _ in moves]
            with mx.stream(side_stream("fill")):
                done = self._fill(
                    mx.depends(mx.array(slots), list(after[-1:])), addresses, arrays, FILL_BLOCKS
                )
            self._behind = [done, np.array(keys), FILL_BEHIND_TOKENS * self._per_token]
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
