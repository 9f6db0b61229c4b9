"""Fields a config.json leaves out, where transformers' config class fills a default that mlx-lm's
ModelArgs does not, or fills another: filled as transformers fills them. And Nemotron-H's layer
pattern as one string.

A config.json written by hand, trimmed, or written by a model's own code can leave a field out
(transformers 5.24's own `save_pretrained` writes them all, defaults too); transformers then
computes with its class's default, and mlx-lm's ModelArgs with its own: gpt-oss without
`rope_scaling` is YaRN (factor 32) to transformers and plain RoPE to mlx-lm (0.43 logits apart
from the first token, through the attention sinks).
transformers' defaults are the published models' values (its config classes are written from
them). Found by comparing, for each family that streams, the config class's defaults with
ModelArgs' for the fields the model reads; tests/test_config_defaults.py checks each value below
against transformers' class and that mlx-lm's default differs. Not filled: sizes and counts (a
config without them is refused, or its weights' shapes are), and fields no fill makes what the
published model computes: UNFILLED refuses those with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from ...errors import StreamerError

# gpt-oss's rope_parameters default, as rope_scaling (mlx-lm's gpt_oss reads its rope_theta alone)
GPT_OSS_YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
DEEPSEEK_V3 = {"routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4}

# model_type -> field -> transformers' default, filled where config.json has no such field
FILLED: dict[str, dict[str, object]] = {
    "gpt_oss": {"rope_scaling": GPT_OSS_YARN},
    "deepseek_v3": DEEPSEEK_V3,
    "deepseek_v32": DEEPSEEK_V3,
    "qwen3_next": {"norm_topk_prob": True},  # mlx-lm: False, no renormalized top-k
    "phimoe": {"rms_norm_eps": 1e-5},
    "nemotron_h": {"norm_topk_prob": True, "routed_scaling_factor": 1.0},  # mlx-lm: None
    "kimi_linear": {
        "routed_scaling_factor": 2.446,
        "num_experts_per_token": 8,
        "num_shared_experts": 1,
    },
    "afmoe": {"route_scale": 1.0, "mup_enabled": False, "sliding_window": 1024},
    "step3p5": {"moe_router_scaling_factor": 1.0},
    # position_embedding_type None: no RoPE (spellings.py's NULL_MEANS spells it "nope")
    "granitemoehybrid": {"time_step_limit": [0.0, math.inf], "position_embedding_type": None},
    "granitemoe": {"tie_word_embeddings": False},
    "olmoe": {"tie_word_embeddings": False},
    "jamba": {"tie_word_embeddings": False},
}
# transformers 5 keeps RoPE settings in rope_parameters (spellings.py reads them): one given
# there is not left out
WRITTEN_AS = {"rope_scaling": "rope_parameters"}


# Lists of one-letter layer kinds published as one string (Nemotron-H's "ME*EME", in NVIDIA's
# configs and as transformers writes it): model_type -> field -> the letters mlx-lm's model builds.
# mlx-lm iterates the string, a letter a layer, as the list; one with another letter stays refused.
LETTER_LISTS = {"nemotron_h": {"hybrid_override_pattern": "M*-E"}}


def letters_listed(config: dict) -> dict:
    """`config` with LETTER_LISTS' strings as the lists of letters mlx-lm computes from them."""
    listed = {
        name: list(config[name])
        for name, letters in LETTER_LISTS.get(config.get("model_type"), {}).items()
        if isinstance(config.get(name), str) and set(config[name]) <= set(letters)
    }
    return {**config, **listed} if listed else config


def fill_defaults(config: dict) -> dict:
    """`config` with the fields of FILLED it leaves out set to transformers' defaults."""
    filled = FILLED.get(config.get("model_type"), {})
    missing = {
        field: value
        for field, value in filled.items()
        if field not in config and WRITTEN_AS.get(field) not in config
    }
    return {**config, **missing} if missing else config


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


# model_type -> why a config that leaves out (or nulls) a field cannot be computed as the
# published model means, by filling or by mlx-lm's default (None: it can)
UNFILLED: dict[str, Callable[[dict], str | None]] = {
    "step3p5": _step3p5_window,
    "mimo_v2_flash": _mimo_value_scale,
}


def refuse_unfilled(config: dict, where: Path | str) -> None:
    """Refuse `config` where UNFILLED says no value of a field it leaves out is the model's."""
    check = UNFILLED.get(config.get("model_type"))
    reason = check(config) if check is not None else None
    if reason is not None:
        raise StreamerError(f"{where}: {reason}")
