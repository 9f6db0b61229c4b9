"""Compute modes that compute in place on the mapped expert files, and the read-ahead policy.

The OS page cache is the cache and nothing is copied: mlx-lm's gather kernels read just the routed
experts' pages of the files' views (io/expert_files.py). What the mapping alone does badly is a
miss: page faults fetch one OS page at a time, in series. So before a layer computes, `fetch`
asks mincore which routed experts are cold and announces each of their ranges with one
madvise(WILLNEED), which starts the kernel reading all of them at once in large requests; it then
populates the routed ranges not yet in this process's page tables, which waits for those reads,
so the compute touches only mapped pages (bench/findings.md has the measured rates).

While the layer's files are all in the page cache none of this is needed, nor the routing on the
host: InPageCache computes as a resident layer does, with no sync. Every RECHECK_CALLS calls (and
after an eviction) the layer asks again; if the kernel evicted pages meanwhile they are faulted
back in, and the next check hands the layer back to Prefetched.
"""

from __future__ import annotations

import mmap
import time

import mlx.core as mx
import numpy as np

from ..errors import StreamerError
from ..expert_traffic import ExpertTraffic
from ..io.expert_files import ExpertFiles, LayerFiles
from ..io.expert_layout import ByteRange
from ..io.tensor_crcs import mismatched_tensors
from .routing import finish, host_routing

RECHECK_CALLS = 16  # how often a layer asks again whether its files are all in the page cache
# Files this much in the page cache count as cached: the kernel trims rarely used pages even
# without memory pressure (e.g. proactive reclaim), and populating reads them back.
FILE_CACHED_SHARE = 0.99


class Prefetcher:
    """One layer's read-ahead: residency checks, WILLNEED hints, populating, checksums on read."""

    def __init__(
        self, files: ExpertFiles, layer: LayerFiles, checksums: tuple[tuple[int, ...], ...] | None
    ):
        self.all_files, self._files = files, layer
        num_experts = layer.layout.num_experts
        self._populated = np.zeros(num_experts, dtype=bool)  # in this process's page tables
        self._evictions = files.evictions
        self.recent_misses = 0
        self.payload_bytes = layer.layout.payload_bytes
        self.measured_bytes = int(layer.range_lengths.sum())
        self.checksums = checksums
        self.verified = np.zeros(num_experts, dtype=bool)
        self._ranges: list[list[ByteRange] | None] = [None] * num_experts  # made on first use

    def fetch(self, experts: list[int], traffic: ExpertTraffic) -> None:
        """Bring the routed experts into memory and into this process's page tables."""
        files, populated = self._files, self._populated
        start = time.perf_counter()
        self._forget_evicted()
        counts = files.resident_bytes(experts)  # [expert, range]
        if counts is not None:  # None: the OS cannot tell, no hint is given
            measured = len(experts) * self.measured_bytes
            resident = int(counts.sum())
            traffic.bytes_measured += measured
            traffic.bytes_in_page_cache += resident
            if resident < measured:  # some ranges are cold
                cold = counts < self._files.range_lengths
                for i, j in zip(*np.nonzero(cold)):  # a repacked record is 1 range, a download 9
                    files.advise(self._ranges_of(experts[i])[j], mmap.MADV_WILLNEED)
                fetched = np.asarray(experts)[cold.any(axis=1)]
                traffic.experts_fetched += len(fetched)
                populated[fetched] = False  # evicted pages were unmapped too
                self.verified[fetched] = False  # bytes from the disk again: checked again
                self.recent_misses += len(fetched)
        for expert in experts:
            if not populated[expert]:
                populated[expert] = all(files.populate(r) for r in self._ranges_of(expert))
        self.verify(experts)
        traffic.experts_read += len(experts)
        traffic.bytes_read += len(experts) * self.payload_bytes
        traffic.read_seconds += time.perf_counter() - start

    def file_in_page_cache(self) -> bool:
        """Whether the layer's files are in the page cache: all of them, or all but a sliver
        (FILE_CACHED_SHARE) that populating them then reads back. Populating also maps them into
        this process's page tables (no I/O for cached pages), so kernels reading any expert take
        no page faults. A layer that missed since the last call is answered without the OS."""
        if self.recent_misses:
            self.recent_misses = 0
            return False
        self._forget_evicted()
        counts = self._files.regions_resident_bytes()
        if counts is None:  # the OS cannot tell
            return False
        cached, total = int(counts.sum()), self._files.regions_bytes
        if cached < FILE_CACHED_SHARE * total:
            return False
        if cached < total or not self._populated.all():
            regions = self._files.layout.regions
            self._populated[:] = all([self._files.populate(r) for r in regions])
        return True

    def _ranges_of(self, expert: int) -> list[ByteRange]:
        ranges = self._ranges[expert]
        if ranges is None:
            ranges = self._ranges[expert] = self._files.ranges(expert)
        return ranges

    def _forget_evicted(self) -> None:
        if self._evictions != self.all_files.evictions:
            self._evictions = self.all_files.evictions
            self._populated[:] = False

    def verify(self, experts) -> None:
        """With checksums, refuse any of `experts` whose bytes do not match: checked on each read
        from the disk (the first, and again whenever the page cache had dropped some of them)."""
        if self.checksums is None:
            return
        layout = self._files.layout
        names = [t.name for t in layout.tensors]
        for expert in experts:
            if self.verified[expert]:
                continue
            tensors = self._files.tensor_bytes(expert)
            bad = mismatched_tensors(names, self.checksums[expert], tensors)
            if bad:
                raise StreamerError(
                    f"{layout.where(layout.tensors[names.index(bad[0])].at.file)}: expert "
                    f"{expert} tensor {bad[0]} does not match its checksum: the file is corrupt. "
                    f"Run `streamer verify {layout.folder}` to list every bad tensor, then repack."
                )
            self.verified[expert] = True


class PageCacheWatch:
    """Whether a layer's files are all in the page cache, asked of the OS every RECHECK_CALLS
    calls and after an eviction, answered from memory in between."""

    def __init__(self, layer):
        self._prefetcher = layer.prefetcher
        self._all = layer.prefetcher.all_files
        self._calls = self._next_check = 0
        self._evictions = self._all.evictions
        self._cached = False

    def file_cached(self) -> bool:
        self._calls += 1
        if self._calls >= self._next_check or self._evictions != self._all.evictions:
            self._next_check, self._evictions = self._calls + RECHECK_CALLS, self._all.evictions
            self._cached = self._prefetcher.file_in_page_cache()
        return self._cached


class Prefetched:
    """One host sync for the routing, read-ahead of the cold routed experts, then compute on the
    files' views. With a `watch`, it hands the layer to InPageCache once the files are cached
    (without one, as when checking each expert on its first read, it never does)."""

    def __init__(self, layer, watch: PageCacheWatch | None):
        self._watch = watch

    def __call__(self, layer, x: mx.array, indices: mx.array, traffic: ExpertTraffic) -> mx.array:
        # the routing is wanted on the host anyway (trace, profile): no reason to skip the sync
        if self._watch is not None and not layer.stats.wants_routing and self._watch.file_cached():
            layer.compute_mode = InPageCache(layer, self._watch)
            return layer.compute_mode(layer, x, indices, traffic)
        start = time.perf_counter()
        _, experts = host_routing(layer, indices, traffic)
        layer.prefetcher.fetch(experts, traffic)
        return finish(layer, layer.compute(x, indices), traffic, start)  # on the views: no copy


class InPageCache:
    """The layer's files are all in the page cache: nothing to fetch, no need to know the routing
    now. The routed experts are counted later (stats.defer)."""

    def __init__(self, layer, watch: PageCacheWatch):
        self._watch = watch
        prefetcher = layer.prefetcher
        self._sizes = (prefetcher.payload_bytes, prefetcher.measured_bytes)

    def __call__(self, layer, x: mx.array, indices: mx.array, traffic: ExpertTraffic) -> mx.array:
        if layer.stats.wants_routing or not self._watch.file_cached():
            layer.compute_mode = Prefetched(layer, self._watch)
            return layer.compute_mode(layer, x, indices, traffic)
        layer.stats.defer(traffic, indices, *self._sizes)
        return layer.compute(x, indices)
