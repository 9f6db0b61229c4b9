"""Which model types stream: the mlx-lm model file a config runs on (as mlx-lm's loader picks
it), the families refused and why, and each family's HF expert naming."""

from __future__ import annotations

from pathlib import Path

import mlx_lm
from mlx_lm.utils import _get_classes

from .errors import StreamerError
from .hf_naming import NAMING, Architecture
from .transformers_models import computed_otherwise

# mlx-lm model files that build experts streamer does not stream (yet), and why.
REFUSED: dict[str, str] = {
    "kimi_vl": "mlx-lm's kimi_vl sanitize does not split MLA's kv_b_proj, so mlx-lm cannot load "
    "the published checkpoint either (its MLX conversions come from mlx-vlm).",
}


def architecture(config: dict, where: Path | str) -> Architecture:
    """The HF expert naming of `config`'s family (after mlx-lm's own model-type remapping)."""
    model_type = mlx_lm_model_type(config, where)
    if model_type in REFUSED:
        refuse(config, where, REFUSED[model_type])
    otherwise = computed_otherwise(config)  # config.json as transformers wrote it
    if otherwise is not None:
        refuse(config, where, f"mlx-lm computes it otherwise than transformers: {otherwise}")
    return NAMING.get(model_type, Architecture())


def mlx_lm_model_type(config: dict, where: Path | str = "config.json") -> str:
    """The mlx-lm model file `config` runs on (`mlx_lm.models.<this>`), as mlx-lm's loader picks."""
    try:
        _, args_class = _get_classes(config)
    except (KeyError, ValueError, TypeError):
        refuse(config, where, f"it is not a model that mlx-lm {mlx_lm.__version__} runs.")
    # the file mlx-lm imports (its Model may come from another: solar_open runs glm4_moe's)
    return args_class.__module__.rsplit(".", 1)[1]


def refuse(config: dict, where: Path | str, reason: str):
    raise StreamerError(
        f"{where}: model_type {config.get('model_type')!r} is not supported for expert "
        f"streaming: {reason} The README lists the model types that stream."
    )
