"""Where MLX computes, asked in one place by every layer that depends on it: the load's choices
(loading/backend.py: read path, cores, dtype, memory), the slot pool's landing and allocation
(cache/) and how the slot path cuts its calls (experts/slots.py)."""

from __future__ import annotations

import mlx.core as mx


def backend() -> str:
    """Where MLX computes by default: "cpu", "metal" or "cuda"."""
    if mx.default_device() != mx.gpu:
        return "cpu"
    return "cuda" if mx.cuda.is_available() else "metal"
