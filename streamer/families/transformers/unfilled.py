"""Fields a config.json leaves out (or nulls) where no value is both what transformers computes and
what the model's own code and mlx-lm compute, or where neither default is the published models':
refused with the reason, since no fill (defaults.py) nor mlx-lm's default is right. Checked on
config.json and on a vision-language model's text_config, by the model_type transformers reads
each as.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...errors import StreamerError
from .defaults import text_model_type


def _step3p5_window(config: dict) -> str | None:
    """A null sliding_window (transformers' default) is a window only where no layer slides."""
    if config.get("sliding_window", 0) is not None:  # left out: mlx-lm's default, 512
        return None
    kinds, layers = config.get("layer_types"), config.get("num_hidden_layers")
    if isinstance(kinds, list):
        sliding, how = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"], ""
    else:  # mlx-lm's step3p5 without layer_types: every even layer slides
        sliding = list(range(0, layers, 2)) if type(layers) is int else [0]
        how = " (mlx-lm slides every even layer without layer_types)"
    if not sliding:
        return None  # all full attention: neither model reads the window
    shown = ", ".join(map(str, sliding[:4]))
    shown += f" ... ({len(sliding)} layers)" if len(sliding) > 4 else ""
    return (
        f"sliding_window is null, but layers {shown} are sliding_attention{how}: a sliding layer "
        "needs its window (transformers' step3p5 model raises without one, mlx-lm's cannot cache "
        "one); set sliding_window to the model's window, as its published config.json says."
    )


def _mimo_value_scale(config: dict) -> str | None:
    """transformers' MiMo-V2-Flash scales the attention values by 0.707 where the field is left
    out, the hub's own code (and mlx-lm) by 1: the published configs all say 0.707."""
    if "attention_value_scale" in config:
        return None  # a number both compute; null is no scaling to both
    return (
        "attention_value_scale is left out: transformers' mimo_v2_flash then scales the attention "
        "values by 0.707 (its default, the published models' value), MiMo's own code and mlx-lm "
        'by 1; add "attention_value_scale": 0.707 to config.json as published (null: no scaling).'
    )


def _gemma4_softcap(config: dict) -> str | None:
    if "final_logit_softcapping" in config:
        return None
    return (
        "final_logit_softcapping is left out: transformers' gemma4 then caps no logits, mlx-lm "
        'at 30.0 (the published models\' value); add "final_logit_softcapping": 30.0 to '
        "config.json as published (null: no cap)."
    )


def _qwen3_5_rope(config: dict) -> str | None:
    if "rope_parameters" in config or "rope_theta" in config:
        return None  # a rope_theta alone is read into rope_parameters (defaults.READ_FROM)
    return (
        "rope_parameters is left out: transformers' qwen3_5_moe_text then computes RoPE with base "
        "10000, mlx-lm with 100000, the published models with 10000000; add the published "
        "rope_parameters to config.json."
    )


def _minimax_m3_rotary(config: dict) -> str | None:
    """transformers' MiniMax-M3 rotates rope_parameters' share of the head (all of it where none
    is given) and never reads rotary_dim; mlx-lm's rotates rotary_dim dims, else its share of the
    head (half where none is given, as published)."""
    rope = config.get("rope_parameters")
    share = (rope if isinstance(rope, dict) else {}).get(
        "partial_rotary_factor", config.get("partial_rotary_factor")
    )
    rotary, head = config.get("rotary_dim"), config.get("head_dim")
    if share is None and rotary is None:
        return (
            "rope_parameters has no partial_rotary_factor: transformers' minimax_m3_vl then "
            "rotates all of each head, mlx-lm half of it (the published models' 0.5); add the "
            "published rope_parameters to config.json."
        )
    if rotary is None or type(head) is not int or not isinstance(share or 1.0, (int, float)):
        return None
    rotated = int(head * (1.0 if share is None else share))
    if rotary == rotated:
        return None
    return (
        f"rotary_dim is {rotary}, but rope_parameters' share of the {head}-dim head is {rotated} "
        f"dims: transformers' minimax_m3_vl rotates those {rotated} (it reads no rotary_dim), "
        f"mlx-lm {rotary}; make them agree as the published config.json does."
    )


# model_type -> why a config that leaves out (or nulls) a field cannot be computed as the
# published model means, by filling or by mlx-lm's default (None: it can)
UNFILLED: dict[str, Callable[[dict], str | None]] = {
    "step3p5": _step3p5_window,
    "mimo_v2_flash": _mimo_value_scale,
    "gemma4_text": _gemma4_softcap,
    "qwen3_5_moe_text": _qwen3_5_rope,
    "minimax_m3_vl_text": _minimax_m3_rotary,
}


def refuse_unfilled(config: dict, where: Path | str) -> None:
    """Refuse `config` where UNFILLED says no value of a field it leaves out is the model's, in
    a vision-language model's text_config too."""
    text = config.get("text_config")
    for values, kind, prefix in (
        (config, config.get("model_type"), ""),
        (text, text_model_type(config), "text_config."),
    ):
        check = UNFILLED.get(kind) if isinstance(values, dict) else None
        reason = check(values) if check is not None else None
        if reason is not None:
            raise StreamerError(f"{where}: {prefix}{reason}")
