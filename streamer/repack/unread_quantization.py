"""The `quantization_config`s a source may not carry: those left once its spellings are read
(AWQ, GPTQ, NVFP4 packs, ...), which streamer cannot repack. repack and plan refuse them alike."""

from __future__ import annotations

from pathlib import Path

from ..errors import StreamerError
from ..families.mlx_lm_models import package_version

# quantization formats mlx-lm names but whose checkpoints no mlx-lm model loads: why
UNREAD_FORMATS = {
    "nvfp4-pack-quantized": f"as no sanitize of mlx-lm {package_version()} reads its experts' "
    "`weight_global_scale`, so mlx-lm cannot load it either (nothing to be exact against)",
}


def refuse_unread_quantization(config: dict, where: Path | str) -> None:
    """Refuse a normalized `config` whose `quantization_config` streamer does not read."""
    if "quantization" in config or "quantization_config" not in config:
        return
    method = config["quantization_config"].get("quant_method", "?")
    fmt = config["quantization_config"].get("format")
    # mlx-lm's loader reads some that streamer does not (AWQ, GPTQ): no claim about mlx-lm
    why = f", {UNREAD_FORMATS[fmt]}" if fmt in UNREAD_FORMATS else ""
    raise StreamerError(
        f"{where}: quantization_config ({method}{f' {fmt!r}' if fmt else ''}) is not "
        f"supported{why}; repack the bf16/fp16 checkpoint (optionally with --quantize) or "
        "an MLX-quantized one."
    )
