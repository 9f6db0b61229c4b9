"""The `quantization_config`s a source may not carry: those left once its spellings are read
(AWQ, GPTQ, NVFP4 packs, ...), which streamer cannot repack. repack and plan refuse them alike."""

from __future__ import annotations

from pathlib import Path

from ..errors import StreamerError
from ..families.transformers.quantization_methods import unread_reason


def refuse_unread_quantization(config: dict, where: Path | str) -> None:
    """Refuse a normalized `config` whose `quantization_config` streamer does not read."""
    if "quantization" in config or "quantization_config" not in config:
        return
    method = config["quantization_config"].get("quant_method", "?")
    fmt = config["quantization_config"].get("format")
    # mlx-lm's loader reads some that streamer does not (AWQ, GPTQ): no claim about mlx-lm
    why = unread_reason(config)
    raise StreamerError(
        f"{where}: quantization_config ({method}{f' {fmt!r}' if fmt else ''}) is not "
        f"supported{f', {why}' if why else ''}; repack the bf16/fp16 checkpoint (optionally "
        "with --quantize) or an MLX-quantized one."
    )
