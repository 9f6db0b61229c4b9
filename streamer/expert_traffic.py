"""Counters of expert traffic, split into prompt processing and decoding: what each MoE layer call
read, copied and waited for, the calls counted later (settled) so that counting never waits for
the GPU, the verify passes' drafts (draft_accounting.py) and the routing trace
(routing_trace.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from .cache.settle import distinct
from .draft_accounting import Drafts, PassCall
from .routing_trace import Routing

UNSETTLED_MAX = 4096  # in-page-cache counts kept for the next read: 85 tokens of 48 layers


@dataclass
class ExpertTraffic:
    layer_calls: int = 0  # MoE layer invocations
    syncs: int = 0  # host syncs (one per MoE layer call that needs routed indices on the host)
    gathered: int = 0  # slot path on CUDA: calls whose experts the GPU gathered itself, no sync
    experts_read: int = (
        0  # routed experts computed from the store's mapped files (page cache or disk)
    )
    experts_fetched: int = 0  # of those, ones not in the page cache: one madvise(WILLNEED) each
    cache_hits: int = 0  # routed experts served from the hot-expert cache instead
    bytes_read: int = 0  # expert bytes computed from the store's mapped files
    bytes_copied: int = 0  # expert bytes copied in memory (0 when computing on the mapped files)
    bytes_in_page_cache: int = 0  # of bytes_read, how many were resident before the read
    bytes_measured: int = 0  # of bytes_read, how many had their residency measured
    read_seconds: float = 0.0  # read-ahead: residency checks, WILLNEED hints, populating
    miss_seconds: float = 0.0  # slot path: of read_seconds, the calls that read a miss
    sync_seconds: float = (
        0.0  # blocked on the routing sync (attention, router, earlier expert compute)
    )
    collectives: int = 0  # expert-parallel: all_sums of the ranks' expert rows (one per layer call)
    collective_bytes: int = 0  # bytes those all_sums summed, per rank
    compute_seconds: float = 0.0  # expert compute, measured only when profiling (it adds a sync)
    layer_seconds: float = 0.0  # wall time inside the expert layer, all of the above included

    def count_slots(self, held: int, read: int, slot_bytes: int) -> None:
        """A slot-path call's experts: `held` found in their slots, `read` from the files."""
        self.cache_hits += held
        self.experts_read += read
        self.experts_fetched += read
        self.bytes_read += read * slot_bytes

    def count_gathered(self, slot_of: np.ndarray, slot_bytes: int, whole: bool, experts) -> None:
        """A gathered call's hits (routed `experts` its table held: `slot_of`) and the experts
        the GPU read from the files (the routed ones without a slot), counted when the pool
        settles its routing; a prompt's (`whole`) stack, a row per routed expert, too."""
        held = int(np.count_nonzero(slot_of[experts] >= 0))
        self.count_slots(held, len(experts) - held, slot_bytes)
        if whole:
            self.bytes_copied += len(experts) * slot_bytes

    @property
    def page_cache_hit_rate(self) -> float | None:
        return self.bytes_in_page_cache / self.bytes_measured if self.bytes_measured else None


@dataclass
class ExpertStats:
    moe_layers: int
    profile: bool = False  # evaluate each layer's expert output on its own to time the compute
    trace: list[Routing] | None = None  # set to [] to record the routing of decode steps
    trace_prefill: bool = False  # the trace also records every prompt token
    _prefill: ExpertTraffic = field(default_factory=ExpertTraffic)
    _decode: ExpertTraffic = field(default_factory=ExpertTraffic)
    # Calls that ran without a sync, counted when the counters are read, not before (counting
    # pulls a call's routing, which waits for the GPU to compute it): in-page-cache calls
    # (defer: traffic, routed indices, payload and measured bytes per expert), and the slot
    # pools holding gathered calls' routings (settle_before_reading).
    unsettled: list[tuple[ExpertTraffic, mx.array, int, int]] = field(default_factory=list)
    settles: list[Callable[[], None]] = field(default_factory=list)
    drafts: Drafts = field(default_factory=Drafts)
    verifying: list[PassCall] | None = None  # the layer calls of the verify pass under way

    @property
    def wants_routing(self) -> bool:
        """Whether each layer must learn its routing on the host (tracing or profiling)."""
        return self.trace is not None or self.profile

    @property
    def prefill(self) -> ExpertTraffic:
        self._settle()
        return self._prefill

    @property
    def decode(self) -> ExpertTraffic:
        self._settle()
        return self._decode

    def counted(self) -> tuple[ExpertTraffic, ExpertTraffic]:
        """(prefill, decode) as counted so far, without the calls still unsettled: what a reader
        that must not wait for the GPU sees (mlx-lm keeps the next token in flight while it
        yields one; counting that token's calls would wait for all of it)."""
        return self._prefill, self._decode

    def defer(
        self, traffic: ExpertTraffic, indices: mx.array, payload_bytes: int, measured_bytes: int
    ) -> None:
        """An in-page-cache call, counted when the counters are next read; the oldest are
        counted here once UNSETTLED_MAX wait, so a long run read only at its end holds a bounded
        list (calls that many layers back are computed: nothing waits)."""
        self.unsettled.append((traffic, indices, payload_bytes, measured_bytes))
        if len(self.unsettled) > UNSETTLED_MAX:
            half = UNSETTLED_MAX // 2
            _count_in_page_cache(self.unsettled[:half])
            del self.unsettled[:half]

    def settle_before_reading(self, settle: Callable[[], None]) -> None:
        """`settle` (a slot pool's) run before the counters are next read."""
        if settle not in self.settles:
            self.settles.append(settle)

    def reset(self) -> None:
        self._prefill, self._decode = ExpertTraffic(), ExpertTraffic()
        self.unsettled.clear()
        self.settles.clear()
        self.drafts, self.verifying = Drafts(), None

    def phase(self, tokens: int) -> ExpertTraffic:
        """Single-token calls and verify passes are decode steps; anything wider is prompt
        processing."""
        return self._decode if tokens == 1 or self.verifying is not None else self._prefill

    def start_pass(self) -> None:
        """The layer calls from here to `end_pass` verify drafted tokens: decode, logged."""
        self.verifying = []

    def end_pass(self, drafted: int, accepted: int) -> None:
        """The pass's inputs were the last token and `drafted` drafts, of which `accepted` were
        kept (the loop counts `drafts.emitted` as it yields)."""
        calls, self.verifying = self.verifying or [], None
        self.drafts.count_pass(calls, drafted, accepted)

    def record_routing(self, layer: int, routed: np.ndarray) -> None:
        """Append one call's routing ([..., k] expert ids on the host) to the trace."""
        tokens = routed.reshape(-1, routed.shape[-1])
        if len(tokens) == 1 or self.trace_prefill:
            self.trace.extend((layer, tuple(sorted(token))) for token in tokens.tolist())

    def _settle(self) -> None:
        if self.unsettled:
            _count_in_page_cache(self.unsettled)
            self.unsettled.clear()
        for settle in self.settles:
            settle()
        self.settles.clear()

    @property
    def decode_tokens(self) -> int:
        """Tokens decoded: one per step, and every token a verify pass yielded (layer calls are
        counted when made: nothing to settle)."""
        calls = self._decode.layer_calls
        return calls // self.moe_layers + self.drafts.emitted - self.drafts.passes


def _count_in_page_cache(calls: list[tuple[ExpertTraffic, mx.array, int, int]]) -> None:
    """In-page-cache calls' routed experts counted, all their routings pulled at once."""
    for (traffic, _, payload_bytes, measured_bytes), experts in zip(
        calls, distinct([indices for _, indices, _, _ in calls])
    ):
        traffic.experts_read += len(experts)
        traffic.bytes_read += len(experts) * payload_bytes
        traffic.bytes_in_page_cache += len(experts) * measured_bytes  # the whole file was cached
        traffic.bytes_measured += len(experts) * measured_bytes
