"""Fields a config.json leaves out, where transformers' config class fills a default that mlx-lm's
ModelArgs does not, or fills another: filled as transformers fills them. And Nemotron-H's layer
pattern as one string.

transformers' `save_pretrained` writes only the fields that differ from its config class's
defaults, so a checkpoint it wrote at a default leaves that field out, and mlx-lm's ModelArgs then
computes with its own default: gpt-oss without `rope_scaling` is YaRN (factor 32) to transformers
and plain RoPE to mlx-lm (0.43 logits apart from the first token, through the attention sinks).
transformers' defaults are the published models' values (its config classes are written from
them). Found by comparing, for each family that streams, the config class's defaults with
ModelArgs' for the fields the model reads; tests/test_config_defaults.py checks each value below
against transformers' class and that mlx-lm's default differs. Not filled: sizes and counts (a
config without them is refused, or its weights' shapes are), and fields whose transformers
default mlx-lm's model cannot compute (Step-3.5's `sliding_window: null`).
"""

from __future__ import annotations

import math

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
