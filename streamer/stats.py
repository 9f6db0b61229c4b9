"""Counters of expert traffic, split into prompt processing and decoding, and routing traces."""

from __future__ import annotations

import math
import resource
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .cache.settle import distinct
from .io.sizes import size_text

# One routed token of one MoE layer: (MoE layer number, the token's experts, sorted).
Routing = tuple[int, tuple[int, ...]]
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

    @property
    def page_cache_hit_rate(self) -> float | None:
        return self.bytes_in_page_cache / self.bytes_measured if self.bytes_measured else None


@dataclass
class PassCall:
    """One MoE layer call of a speculative verify pass: its routing (evaluated with the pass), what
    one expert read costs there, and the experts it found in memory instead (slot or cache hits)."""

    indices: object  # mx.array [..., inputs, k]
    read_bytes: int
    hits: set[int] = field(default_factory=set)


@dataclass
class Drafts:
    """Speculative decoding: verify passes, the draft tokens they checked and accepted, the tokens
    they emitted, and the expert reads only rejected drafts routed to (wasted)."""

    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    wasted_experts: int = 0
    wasted_bytes: int = 0

    def line(self, wasted_bytes_per_token: float) -> str:
        """The stats line's part for drafts (`wasted_bytes_per_token`: per decoded token)."""
        kept = f"{self.accepted / self.drafted:.0%}" if self.drafted else "n/a"
        return (
            f" | drafts: {self.accepted / self.passes:.1f} of {self.drafted / self.passes:.1f} "
            f"kept per pass ({kept}), {self.emitted / self.passes:.2f} tokens/pass, wasted "
            f"{size_text(wasted_bytes_per_token)}/token"
        )


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
        kept (the loop counts `drafts.emitted` as it yields). An expert only the rejected inputs
        routed to was read for nothing: counted as waste (evaluated with the pass: no sync)."""
        calls, self.verifying = self.verifying or [], None
        drafts = self.drafts
        drafts.passes += 1
        drafts.drafted += drafted
        drafts.accepted += accepted
        kept = accepted + 1
        for call in calls if kept <= drafted else ():
            routed = np.array(call.indices)
            routed = routed.reshape(-1, routed.shape[-1])  # one row per input, in order
            wasted = set(np.unique(routed[kept:]).tolist()) - set(routed[:kept].ravel().tolist())
            wasted -= call.hits
            drafts.wasted_experts += len(wasted)
            drafts.wasted_bytes += len(wasted) * call.read_bytes

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


class RoutingRecorder(nn.Module):
    """An mlx-lm expert container that records its routing in `stats.trace` (streamed layers
    record their own)."""

    def __init__(self, inner: nn.Module, stats: ExpertStats, layer: int):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "_stats", stats)
        self._layer = layer

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        self._stats.record_routing(self._layer, np.array(indices))
        return self.inner(x, indices)


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def top_tenth(num_experts: int) -> int:
    """How many experts "the top 10%" of a layer's are: at least one."""
    return max(1, math.ceil(0.1 * num_experts))


def routing_skew(routed: np.ndarray, num_experts: int, starts: Sequence[int] = (0,)) -> dict:
    """How one MoE layer's routing (`routed`: [tokens, k] expert ids) is spread: the share of its
    picks the top 10% of experts take, the entropy of its expert use (1: uniform), the share of a
    token's experts the previous token also used (pairs across a window start in `starts`
    skipped), the largest share, and the experts never used."""
    k = routed.shape[1]
    counts = np.bincount(routed.reshape(-1), minlength=num_experts).astype(np.float64)
    share = counts / counts.sum()
    top = top_tenth(num_experts)
    p = share[share > 0]
    entropy = float(-(p * np.log(p)).sum() / math.log(num_experts))
    same_window = np.ones(len(routed) - 1, dtype=bool)
    same_window[np.asarray(starts, dtype=np.int64)[1:] - 1] = False
    a, b = routed[:-1][same_window], routed[1:][same_window]
    overlap = (a[:, :, None] == b[:, None, :]).any(-1).sum(-1).mean() / k
    return {
        "top10_share": float(np.sort(share)[::-1][:top].sum()),
        "top10_experts": top,
        "entropy": entropy,
        "overlap": float(overlap),
        "max_share": float(share.max()),
        "unused": int((counts == 0).sum()),
    }
