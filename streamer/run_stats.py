"""What one generation cost: the figures every streamed piece carries, and the stats line."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn

from .arguments import tokens_text
from .draft_accounting import Drafts
from .expert_traffic import ExpertStats
from .io.sizes import size_text


@dataclass(frozen=True)
class RunStats:
    """What one generation cost. Per-token figures are for decode steps (prompt excluded)."""

    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    # the OS's peak: mapped file pages (the experts' files) counted too; the run's own on Linux,
    # the process's elsewhere
    peak_rss_bytes: int
    peak_mlx_bytes: int  # MLX's own memory: the mapped expert files are not counted
    expert_bytes_per_token: float
    expert_bytes_copied_per_token: (
        float  # memory copies of expert bytes (one per read, plus cache hits)
    )
    expert_reads_per_token: float
    syncs_per_token: float
    page_cache_hit_rate: float | None  # share of expert bytes already in the page cache when read
    prefill_expert_bytes: int
    drafts: Drafts | None = None  # speculative decoding: its passes, drafts and waste
    wasted_bytes_per_token: float = 0.0  # expert bytes read only for drafts the model rejected
    dtype: str = ""  # what the model computed in
    # resident now, at the run's end (Linux): the process's anonymous memory, and file pages it
    # maps (the experts' files, libraries), which the OS drops under pressure; None elsewhere
    rss_anon_bytes: int | None = None
    rss_file_bytes: int | None = None

    def line(self) -> str:
        hit = "n/a" if self.page_cache_hit_rate is None else f"{self.page_cache_hit_rate:.0%}"
        drafts = "" if self.drafts is None else self.drafts.line(self.wasted_bytes_per_token)
        # mlx-lm times decode from the first token: one token has no interval to rate
        rate = f"{self.generation_tps:.1f}" if self.generation_tokens > 1 else "n/a"
        return (
            f"prompt: {tokens_text(self.prompt_tokens)}, {self.prompt_tps:.1f} tok/s | "
            f"decode: {tokens_text(self.generation_tokens)}, {rate} tok/s | "
            f"experts: {size_text(self.expert_bytes_per_token)}/token, "
            f"{self.expert_reads_per_token:.1f} reads/token, "
            f"page-cache hits {hit} | syncs/token {self.syncs_per_token:.1f} | "
            f"{self.memory()}" + (f" | {self.dtype}" if self.dtype else "") + drafts
        )

    def memory(self) -> str:
        """MLX's peak (as mlx-lm's "Peak memory") and the process's own memory apart from the
        mapped file pages the OS counts in its RSS (at a 2 GiB budget on CUDA: 16.9 GiB peak RSS,
        1.1 GiB of it the process's own)."""
        mlx = f"memory: MLX peak {size_text(max(self.peak_mlx_bytes, 0))}"
        if self.rss_anon_bytes is None or self.rss_file_bytes is None:
            return f"{mlx}, peak RSS {size_text(self.peak_rss_bytes)} (mapped files included)"
        return (
            f"{mlx}, RSS {size_text(self.rss_anon_bytes)} own + "
            f"{size_text(self.rss_file_bytes)} mapped file pages"
        )


def memory_status() -> dict[str, int]:
    """Linux's /proc/self/status memory figures in bytes: RssAnon and RssFile (resident now,
    anonymous and file-backed), VmHWM (the peak since reset_peak_rss); {} where there is none
    (macOS reports no such split: its RSS counts the mapped pages with the rest)."""
    try:
        with open("/proc/self/status", "rb") as f:
            fields = [line.split(b":", 1) for line in f if line.startswith(_STATUS_FIELDS)]
        return {name.decode(): int(value.split()[0]) << 10 for name, value in fields}
    except (OSError, ValueError, IndexError):
        return {}


_STATUS_FIELDS = (b"RssAnon:", b"RssFile:", b"VmHWM:")


def rss_split() -> tuple[int | None, int | None]:
    """(anonymous, file-backed) resident bytes now; (None, None) where there is no split."""
    status = memory_status()
    return status.get("RssAnon"), status.get("RssFile")


_peak_before_reset = 0  # the process's peak RSS as the last reset_peak_rss found it (Linux)


def reset_peak_rss() -> None:
    """Count the peak RSS from now: each run's own (a server's answers each gave the peak of
    every answer before). Linux alone can (/proc/self/clear_refs); macOS keeps the process's."""
    global _peak_before_reset
    _peak_before_reset = max(_peak_before_reset, memory_status().get("VmHWM", 0))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes() -> int:
    """The process's peak RSS since it started, whatever reset_peak_rss reset (a benchmark's
    figure for its whole run)."""
    return max(_os_peak_rss(), _peak_before_reset)


def _os_peak_rss() -> int:
    """The OS's peak RSS: on Linux since reset_peak_rss, but threads that ended since keep the
    peak they saw in it (a server's handlers end after each request)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def run_stats(
    model: nn.Module,
    prompt_tokens: int = 0,
    prompt_tps: float = 0.0,
    generation_tokens: int = 0,
    generation_tps: float = 0.0,
    settle: bool = True,
) -> RunStats:
    """The run's figures; `settle=False` leaves out the calls whose counting would wait for the
    GPU (every piece but the last: mlx-lm has the next token in flight)."""
    handle = model.streamer
    stats: ExpertStats = handle.stats
    prefill, decode = (stats.prefill, stats.decode) if settle else stats.counted()
    steps = max(stats.decode_tokens, 1)
    status = memory_status() if settle else {}  # read once: 80 us here, not per token
    return RunStats(
        prompt_tokens=prompt_tokens,
        prompt_tps=prompt_tps,
        generation_tokens=generation_tokens,
        generation_tps=generation_tps,
        peak_rss_bytes=status.get("VmHWM") or _os_peak_rss(),
        peak_mlx_bytes=mx.get_peak_memory() - handle.mapped_mlx_bytes,
        expert_bytes_per_token=decode.bytes_read / steps,
        expert_bytes_copied_per_token=decode.bytes_copied / steps,
        expert_reads_per_token=decode.experts_read / steps,
        syncs_per_token=decode.syncs / steps,
        page_cache_hit_rate=decode.page_cache_hit_rate,
        prefill_expert_bytes=prefill.bytes_read,
        drafts=replace(stats.drafts) if stats.drafts.passes else None,
        wasted_bytes_per_token=stats.drafts.wasted_bytes / steps,
        dtype=handle.dtype,
        rss_anon_bytes=status.get("RssAnon"),
        rss_file_bytes=status.get("RssFile"),
    )


def settled(model: nn.Module, stats: RunStats) -> RunStats:
    """`stats` (a streamed piece's) with every call made so far counted: for a consumer that
    stops before the last piece."""
    return run_stats(
        model, stats.prompt_tokens, stats.prompt_tps, stats.generation_tokens, stats.generation_tps
    )
