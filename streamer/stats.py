"""Counters of expert traffic, split into prompt processing and decoding."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ExpertTraffic:
    layer_calls: int = 0  # MoE layer invocations
    syncs: int = 0  # host syncs (one per MoE layer call that needs routed indices on the host)
    experts_read: int = (
        0  # routed experts computed from the store's mapped files (page cache or disk)
    )
    experts_fetched: int = 0  # of those, ones not in the page cache: one madvise(WILLNEED) each
    cache_hits: int = 0  # routed experts served from the hot-expert cache instead
    bytes_read: int = 0  # expert bytes computed from the store's mapped files
    bytes_copied: int = 0  # expert bytes copied in memory (0 when computing on the mapped files)
    bytes_in_page_cache: int = 0  # of bytes_read, how many were resident before the read
    bytes_measured: int = 0  # of bytes_read, how many had their residency measured
    read_seconds: float = 0.0  # inside the store: residency checks and WILLNEED hints
    sync_seconds: float = (
        0.0  # blocked on the routing sync (attention, router, earlier expert compute)
    )
    collectives: int = 0  # expert-parallel: all_sums of the ranks' expert rows (one per layer call)
    collective_bytes: int = 0  # bytes those all_sums summed, per rank
    compute_seconds: float = 0.0  # expert compute, measured only when profiling (it adds a sync)
    layer_seconds: float = 0.0  # wall time inside the expert layer, all of the above included

    @property
    def page_cache_hit_rate(self) -> float | None:
        return self.bytes_in_page_cache / self.bytes_measured if self.bytes_measured else None


@dataclass
class ExpertStats:
    moe_layers: int
    profile: bool = False  # evaluate each layer's expert output on its own to time the compute
    trace: list[tuple[int, tuple[int, ...]]] | None = None  # set to [] to record decode routing
    _prefill: ExpertTraffic = field(default_factory=ExpertTraffic)
    _decode: ExpertTraffic = field(default_factory=ExpertTraffic)
    # Calls that ran without a sync (their layer's file was all in the page cache): (traffic,
    # routed indices, expert bytes, record bytes), counted once the indices have been computed.
    unsettled: list[tuple[ExpertTraffic, object, int, int]] = field(default_factory=list)

    @property
    def prefill(self) -> ExpertTraffic:
        self._settle()
        return self._prefill

    @property
    def decode(self) -> ExpertTraffic:
        self._settle()
        return self._decode

    def reset(self) -> None:
        self._prefill, self._decode = ExpertTraffic(), ExpertTraffic()
        self.unsettled.clear()

    def phase(self, tokens: int) -> ExpertTraffic:
        """Single-token calls are decode steps; anything wider is prompt processing."""
        return self._decode if tokens == 1 else self._prefill

    def _settle(self) -> None:
        for traffic, indices, expert_bytes, record_bytes in self.unsettled:
            routed = len(np.unique(np.array(indices)))  # computed by now: no wait
            traffic.experts_read += routed
            traffic.bytes_read += routed * expert_bytes
            traffic.bytes_in_page_cache += routed * record_bytes  # the whole file was cached
            traffic.bytes_measured += routed * record_bytes
        self.unsettled.clear()

    @property
    def decode_tokens(self) -> int:
        return self.decode.layer_calls // self.moe_layers


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB
