"""`streamer plan`: what a model needs before it is downloaded or repacked.

A repacked folder is planned from its own files (plan/repacked.py: no mlx-lm import, so the
command starts at once); a config.json or a download from mlx-lm's own model for it, built with
lazy weights (plan/model.py). plan/report.py is what both report.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from ..errors import StreamerError
from ..io.files import gguf_refusal
from ..io.manifest import MANIFEST_FILE
from .report import ModelPlan

__all__ = ["ModelPlan", "plan"]


def plan(
    source: Path,
    memory_bytes: int,
    *,
    quantize: tuple | None = None,
    dtype: mx.Dtype | None = None,
    kv: tuple[int, int] | None = None,
) -> ModelPlan:
    """`source`: a config.json, a download's folder or a repacked folder. `quantize`: (bits,
    group size[, mode]) of `repack --quantize`. `dtype`: the compute dtype (None: the
    checkpoint's). `kv`: (bits, group size) of mlx-lm's quantized KV cache (--kv-bits)."""
    gguf = gguf_refusal(source)
    if gguf:
        raise StreamerError(gguf)
    folder = source if source.is_dir() else source.parent  # a FIFO is a file: refused as one
    if (folder / MANIFEST_FILE).exists():
        if quantize:
            raise StreamerError(
                f"{folder} is repacked already: --quantize plans a repack of a download."
            )
        if source.is_dir():
            from .repacked import repacked_plan

            found = repacked_plan(folder, memory_bytes, dtype, kv)
            if found is not None:
                return found
    from .model import model_plan

    return model_plan(source, memory_bytes, quantize, dtype, kv)
