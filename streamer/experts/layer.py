"""The streaming expert layer: a drop-in for mlx-lm's SwitchGLU / SwitchMLP.

It keeps the call contract `(x [..., D], indices [..., k]) -> [..., k, D]`, so every architecture's
router and score code runs unchanged. How the routed experts' weights reach the compute is the
layer's compute mode, chosen once when the layer is built and again when what it holds changes
(`make_resident`, `use_cache`, or a mapped file entering or leaving the page cache). ("Read path"
is the load's choice alone, loading/options.py: "mapped" layers take one of the modes on mapped
files below, "slots" layers the slot pool's.)

  resident.Resident        every expert in memory: runs as mlx-lm's, no sync, no reads
  mapped.InPageCache       the layer's files all in the page cache: computes on the mapped
                           files, no sync (the routing is counted later, when the counters are read)
  mapped.Prefetched        one host sync for the routing, read-ahead of the cold routed experts,
                           then computes on the mapped files: no copy
  gather.GatherConvert     the compute dtype differs from the stored one: routed experts copied
  hot_reads.HotReads       a hot-expert cache: hits from memory, misses copied from the files
  slots.Slots              a bounded slot pool filled by reads, the files never mapped: the
                           default on Metal and CUDA (the GPU only ever sees bounded buffers)

The compute-mode contract (the seam a new mode plugs into):
  - A mode is an object built by `choose_compute_mode` (from the layer's state) and called as
    `mode(layer, x, indices, traffic) -> out`, with x and indices exactly as the container gets
    them and `out` what the container returns ([..., k, D]). A mode keeps no reference to the
    layer (that would be a cycle, and a model must be freed, its files unmapped, by refcount).
  - `traffic` is the ExpertTraffic of this call's phase (prefill or decode); the layer has
    already counted `layer_calls`. The mode counts everything else it does there: routing.py's
    `host_routing` counts syncs and their time (and records stats.trace), `Prefetcher.fetch`
    counts reads, residency and read time, `finish` the layer time (and compute time when
    profiling); a mode that copies counts `bytes_copied`, one that hits a cache `cache_hits`.
    A mode that never syncs hands its call to stats.defer (a slot pool's gathered call: the
    pool's settle to stats.settle_before_reading), counted when the counters are read.
  - A mode may hand the layer to another (`layer.compute_mode = ...`), as the mapped ones do
    when the page cache changes.
  - Adding a mode (a slot pool, in place from a download, another backend): a module here with
    one class, and its case in `choose_compute_mode`. A new file layout needs no mode at all: it
    is an io.expert_layout.LayerLayout. A shard of an expert-parallel group is not a mode either:
    parallel.ExpertShare wraps whichever mode the layer has, and sums the ranks' rows.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..cache.hot_experts import HotExperts
from ..cache.slot_pool import SlotPool
from ..cpu_cores import routed_on_cores
from ..draft_accounting import PassCall
from ..errors import StreamerError
from ..expert_traffic import ExpertStats
from ..io.expert_files import ExpertFiles
from ..io.expert_layout import LayerLayout
from ..io.file_watch import watch_files
from .gather import GatherConvert
from .hot_reads import HotReads
from .mapped import PageCacheWatch, Prefetched, Prefetcher
from .parallel import ExpertShare
from .resident import Resident
from .slots import Slots

CLOSED = "this model was closed (model.streamer.close()): load it again to run it."


def choose_compute_mode(layer: StreamingExperts):
    if layer.resident:
        return Resident()
    if layer.pool is not None:
        return Slots(layer.pool)
    if layer.cache is not None:
        return HotReads(layer)
    if layer.converts:
        return GatherConvert()
    # checksums are checked as a routed expert's bytes are read: that needs the routing each call
    watch = PageCacheWatch(layer) if layer.prefetcher.checksums is None else None
    return Prefetched(layer, watch)  # it moves to InPageCache once the files are found cached


class StreamingExperts(nn.Module):
    def __init__(
        self,
        container: nn.Module,
        layout: LayerLayout,
        stats: ExpertStats,
        dtype: mx.Dtype | None,
        *,
        files: ExpertFiles | None = None,
        checksums: tuple[tuple[int, ...], ...] | None = None,
        share: ExpertShare | None = None,
        cores: int = 1,
    ):
        """With `files` the layer computes on their mapped views (checking `checksums`, [expert]
        [tensor] crc32s, before an expert is computed from bytes read from the disk); without, it
        waits for a slot pool (`use_pool`) and its files are never mapped. `share`:
        expert-parallel, the experts this rank computes (parallel.py wraps the compute mode).
        `cores`: the CPU cores each call's routed entries are cut across (cpu_cores.py)."""
        super().__init__()
        # Held outside the parameter tree: its stacked weights are views of the expert files,
        # slot pool arrays or per-call copies, never evaluated, saved or loaded with the model.
        object.__setattr__(self, "container", container)
        # the container's other children are resident weights the model reads through it (Muse
        # Spark's `experts.post_expert_norm`): children of this layer, loaded with the others
        projections = {t.name.split(".")[0] for t in layout.tensors}
        for name, child in container.children().items():
            if name not in projections and isinstance(child, nn.Module) and child.parameters():
                setattr(self, name, child)
        object.__setattr__(self, "_slots", [tuple(t.name.split(".")) for t in layout.tensors])
        self.index = layout.index
        self.num_experts = layout.num_experts
        self.stats = stats
        self.dtype = dtype
        self.converts = dtype is not None and any(
            mx.issubdtype(t.dtype, mx.floating) and t.dtype != dtype for t in layout.tensors
        )
        self.cache: HotExperts | None = None
        self.pool: SlotPool | None = None
        self.resident = False
        self.closed = False  # its model's files closed: model.streamer.close()
        object.__setattr__(self, "views", None)
        object.__setattr__(self, "_layout", layout)
        object.__setattr__(self, "_watches", [])  # (file number, FileWatch) of the files read
        self.prefetcher = None
        self.compute_mode = None
        if files is not None:
            layer_files = files.layers[self.index]
            object.__setattr__(self, "views", layer_files.views)
            self.files = layer_files
            object.__setattr__(self, "_watches", layer_files.watches)
            self.prefetcher = Prefetcher(files, layer_files, checksums)
            self.install(self.views)
            self.compute_mode = choose_compute_mode(self)
        self.share = share
        self.cores = cores

    def make_resident(self) -> None:
        """Keep every expert of this layer in memory from now on: copied from the mapped files
        (with checksums: each one checked before it is copied, as a streamed expert is before its
        first use), or read into a pool of this layer's own with one slot per expert (slot e =
        expert e; the pool checks checksums on every read)."""
        if self.views is not None:
            self.prefetcher.verify(range(self.files.layout.num_experts))
            tensors = [mx.array(v) for v in self.views]  # mx.array copies
        else:
            slots, _ = self.pool.place(self.index, np.arange(self.num_experts))
            assert (slots == np.arange(self.num_experts)).all(), "needs an empty pool of its own"
            # Copied out of the pool, which is then freed: on CUDA the pool is managed memory, in
            # which the kernels ran at 0.8x of mlx-lm's (bench/findings.md); MLX's copy lands in
            # device memory and runs at its speed. Elsewhere the copy is one pass at load.
            tensors = [mx.array(a) for a in self.pool.arrays]
        self.install([self.convert(t) for t in tensors])
        mx.eval([self.container[p][k] for p, k in self._slots])
        if self.pool is not None:
            self.pool.close()  # read once: its files are closed, its arrays freed with it
            self.pool = None
        self.resident = True
        object.__setattr__(self, "_watches", [])  # no file is read from now on
        self.compute_mode = choose_compute_mode(self)

    def use_cache(self, cache: HotExperts) -> None:
        """Serve hot experts from `cache` (shared by all layers) from now on."""
        self.cache = cache
        self.compute_mode = choose_compute_mode(self)

    def use_pool(self, pool: SlotPool) -> None:
        """Compute on `pool` (shared by the layers of one shape class) from now on."""
        self.pool = pool
        fds = [file.fd for file in pool.layers[self.index].files]
        object.__setattr__(self, "_watches", watch_files(self._layout.files, fds))
        self.compute_mode = choose_compute_mode(self)

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        traffic = self.stats.phase(indices.size // indices.shape[-1])
        traffic.layer_calls += 1
        if self.closed:  # else a resident layer ran on, and a streamed one named a closed file
            raise StreamerError(CLOSED)
        self.check_unchanged()
        if self.stats.verifying is not None:  # a speculative verify pass: its waste is counted
            self.stats.verifying.append(PassCall(indices, self.read_bytes))
        if self.share is not None:
            return self.share(self, x, indices, traffic)
        return self.compute_mode(self, x, indices, traffic)

    def check_unchanged(self) -> None:
        """Stop if a file this layer reads changed since it was opened (io/file_watch.py): the
        experts would compute on other bytes than the ones loaded, and say nothing."""
        for file, watch in self._watches:
            change = watch.change()
            if change is not None:
                raise StreamerError(
                    f"{self._layout.where(file)} {change} while the model was running from it: "
                    f"its experts would compute on other weights, so generation stops; "
                    f"{self._layout.remedy}, then load the model again."
                )

    def compute(self, x: mx.array, indices: mx.array) -> mx.array:
        """The container's call on the weights installed now, its routed entries cut across
        the layer's cores: every compute mode computes through it."""
        return routed_on_cores(self.container, x, indices, self.cores, self._layout.payload_bytes)

    @property
    def read_bytes(self) -> int:
        """What reading one routed expert costs this layer (bytes_read per expert)."""
        if self.resident:
            return 0
        return self.pool.slot_bytes if self.pool is not None else self.prefetcher.payload_bytes

    def convert(self, tensor: mx.array) -> mx.array:
        """`tensor` in the compute dtype (floating tensors only); itself when already so."""
        if (
            self.dtype is not None
            and mx.issubdtype(tensor.dtype, mx.floating)
            and tensor.dtype != self.dtype
        ):
            return tensor.astype(self.dtype)
        return tensor

    def install(self, tensors: list[mx.array]) -> None:
        """Make `tensors` (one per layout tensor) the container's stacked weights."""
        for (projection, kind), tensor in zip(self._slots, tensors):
            self.container[projection][kind] = tensor
