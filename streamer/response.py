"""What stream_generate yields: mlx-lm's GenerationResponse fields, and the run's statistics."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .run_stats import RunStats


@dataclass(frozen=True)
class Response:
    """One streamed piece of text; `stats` covers the run so far (its expert counters leave out
    the calls not yet settled, but in the last piece: `settled` completes them), `logprobs`
    (log-softmax over the vocabulary) is the distribution `token` was sampled from, `from_draft`
    says a draft gave it. The counts and rates mlx-lm's GenerationResponse holds are read from
    `stats`, so code written for mlx_lm.stream_generate reads them the same way."""

    text: str
    token: int
    finish_reason: str | None
    stats: RunStats
    logprobs: mx.array | None = None
    from_draft: bool = False

    @property
    def prompt_tokens(self) -> int:
        return self.stats.prompt_tokens

    @property
    def prompt_tps(self) -> float:
        return self.stats.prompt_tps

    @property
    def generation_tokens(self) -> int:
        return self.stats.generation_tokens

    @property
    def generation_tps(self) -> float:
        return self.stats.generation_tps

    @property
    def peak_memory(self) -> float:
        """MLX's peak in GB, as mlx-lm's, less the mapped expert files (stats.peak_mlx_bytes)."""
        return self.stats.peak_mlx_bytes / 1e9
