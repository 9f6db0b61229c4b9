"""Fields a config.json leaves out, where transformers' config class fills a default that mlx-lm's
ModelArgs does not, or fills another: filled as transformers fills them.

A config.json written by hand, trimmed, or written by a model's own code can leave a field out
(transformers 5.24's own `save_pretrained` writes them all, defaults too); transformers then
computes with its class's default, and mlx-lm's ModelArgs with its own: gpt-oss without
`rope_scaling` is YaRN (factor 32) to transformers and plain RoPE to mlx-lm (0.43 logits apart
from the first token, through the attention sinks). transformers' defaults are the published
models' values (its config classes are written from them). Found by comparing each family's class
defaults with ModelArgs' (tests/test_config_defaults.py checks each against both;
required_defaults.py fills those ModelArgs require). Not filled: sizes and counts the weights'
shapes show (the experts a token routes to, no shape shows: filled here), and fields no fill
makes what the published model computes: unfilled.py refuses those with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .longcat_mimo import MIMO_V2_FLASH_HUB
from .required_defaults import required_fills

# gpt-oss's rope_parameters default, as rope_scaling (mlx-lm's gpt_oss reads its rope_theta alone)
GPT_OSS_YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
# num_experts_per_tok left out: 8 to transformers, 1 to mlx-lm (a count no weight shape shows)
DEEPSEEK_V3 = {
    "routed_scaling_factor": 2.5,
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
}
# Mistral 4's rope_parameters default, less what transformers derives from other fields and
# mlx-lm's mistral4 does not read (partial_rotary_factor, max_position_embeddings); mlx-lm's model
# without it fails at its first token (it reads llama_4_scaling_beta there)
MISTRAL4_YARN = {
    "type": "yarn",
    "rope_theta": 10000.0,
    "factor": 128.0,
    "original_max_position_embeddings": 8192,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
    "llama_4_scaling_beta": 0.1,
}

# model_type -> field -> transformers' default, filled where config.json has no such field
FILLED: dict[str, dict[str, object]] = {
    "gpt_oss": {"rope_scaling": GPT_OSS_YARN},
    "deepseek_v3": DEEPSEEK_V3,
    "deepseek_v32": DEEPSEEK_V3,
    # mlx-lm: norm_topk_prob False, no renormalized top-k
    "qwen3_next": {"norm_topk_prob": True, "rope_theta": 10000.0},
    "phimoe": {"rms_norm_eps": 1e-5, "rope_theta": 1000000.0},
    "nemotron_h": {  # mlx-lm: None (its router raised a TypeError at the first token)
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
    },
    "kimi_linear": {
        "routed_scaling_factor": 2.446,
        "num_experts_per_token": 8,
        "num_shared_experts": 1,
    },
    "afmoe": {
        "route_scale": 1.0,
        "mup_enabled": False,
        "sliding_window": 1024,
        "num_experts_per_tok": 6,  # mlx-lm: 8
    },
    "ernie4_5_moe": {"moe_k": 6, "rope_theta": 500000.0},  # mlx-lm: top-1
    # RoPE bases (transformers 5 keeps them in rope_parameters): mlx-lm's 1e6 (phimoe's 1e4) was
    # 1.3 to 3.3 logits from transformers' base on the fixtures
    "exaone_moe": {"rope_theta": 10000.0},
    "glm4_moe_lite": {"rope_theta": 10000.0},
    "qwen2_moe": {"rope_theta": 10000.0},
    # mlx-lm requires one (its ModelArgs' TypeError, refused as a model it cannot build);
    # transformers' class default (qwen3_next's, ernie4_5_moe's and granitemoe's with their fills)
    "dots1": {"rope_theta": 10000.0},
    "glm4_moe": {"rope_theta": 10000.0},
    "longcat_flash": {"rope_theta": 10000000.0},
    "minimax": {"rope_theta": 1000000.0},
    "qwen3_moe": {"rope_theta": 10000.0},
    # mlx-lm's {} failed to build (a KeyError); transformers reads no top-level rope_theta here
    "mellum": {
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
    },
    "step3p5": {"moe_router_scaling_factor": 1.0},
    # position_embedding_type None: no RoPE (spellings.py's NULL_MEANS spells it "nope")
    "granitemoehybrid": {
        "time_step_limit": [0.0, math.inf],
        "position_embedding_type": None,
        "tie_word_embeddings": False,  # mlx-lm: True, its saved lm_head dropped (37 logits off)
        "num_experts_per_tok": 2,  # mlx-lm: None (a TypeError at the first token)
    },
    "granitemoe": {"tie_word_embeddings": False, "rope_theta": 10000.0},
    "olmoe": {"tie_word_embeddings": False},
    "jamba": {"tie_word_embeddings": False},
    "mistral4": {"rope_parameters": MISTRAL4_YARN},  # mistral3's text model too
    # the indexer's top-k blocks, flat as transformers 5 spells it (the hub's
    # sparse_attention_config nests it, and wins in both): mlx-lm's None failed at a sparse layer
    "minimax_m3_vl_text": {"index_topk_blocks": 16},
    "qwen3_5_moe_text": {"num_experts_per_tok": 8},  # mlx-lm: 0, no expert (it ran so)
    # mlx-lm: 20, its last 20 layers reusing earlier layers' keys and values (their own k_proj
    # and v_proj dropped, so no weight shape shows it): 48 logits apart on a 24-layer model
    "gemma4_text": {"num_kv_shared_layers": 0},  # gemma4's text_config too
    "mimo_v2_flash": MIMO_V2_FLASH_HUB,
}
# RoPE settings given in rope_parameters (transformers 5's, spellings.py reads them) or rope_scaling
WRITTEN_AS = {"rope_scaling": "rope_parameters", "rope_parameters": "rope_scaling"}
WRITTEN_AS |= {"swa_rope_theta": "rope_parameters"}  # MiMo-V2-Flash's sliding layers' base
# Fields an explicit null leaves out to transformers: its RoPE standardization fills these as for
# a missing field, in every config class (gpt-oss's `"rope_scaling": null` is YaRN, factor 32),
# and its config classes make their layer kinds where layer_types is None. Any other null it
# keeps, or refuses: a field's own null is not filled.
NULL_IS_ABSENT = {*WRITTEN_AS, "layer_types"}


def _rope_from_theta(config: dict) -> dict | None:
    """rope_parameters as transformers 5 reads a transformers 4 config's rope_theta (and
    partial_rotary_factor) into them: mlx-lm's qwen3_5 reads rope_parameters only, and its
    default's base (100000) then replaces the config's rope_theta (Qwen3.5's 10000000)."""
    if "rope_theta" not in config:
        return None
    return {
        "rope_type": "default",
        "rope_theta": config["rope_theta"],
        "partial_rotary_factor": config.get("partial_rotary_factor", 0.25),
    }


def _rope_from_scaling(config: dict) -> dict | None:
    """rope_parameters as transformers 5 reads a transformers 4 config's rope_scaling: the same
    settings, with the config's rope_theta (else 10000) and its type as rope_type where they have
    none. mlx-lm's mistral4 reads rope_parameters only: without them it fails at its first token
    (a TypeError, reading llama_4_scaling_beta), or refused a YaRN it then left unapplied."""
    scaling = config.get("rope_scaling")
    if not isinstance(scaling, dict):
        return None
    return {
        "rope_theta": config.get("rope_theta", 10000.0),
        "rope_type": scaling.get("type", "default"),
        **scaling,
    }


def _rope_as_scaling(config: dict) -> dict | None:
    """Mellum's rope_parameters where config.json gives rope_scaling alone (transformers 4's
    spelling): transformers' config sets them to it, as given (its Mellum reads no top-level
    rope_theta); mlx-lm's mellum reads rope_parameters alone, and failed to build (a KeyError).
    One without an entry per layer kind is refused (unfilled.py)."""
    scaling = config.get("rope_scaling")
    return scaling if isinstance(scaling, dict) else None


def _gemma4_layer_types(config: dict) -> list[str] | None:
    """Gemma 4's layer kinds as transformers makes them where none are given: every 6th layer and
    the last full attention. mlx-lm's make every sliding_window_pattern-th (5 by default; a field
    transformers does not read) full: where the global heads' width is the sliding ones', no
    weight shape shows it (15 logits apart on 6 layers)."""
    layers = config.get("num_hidden_layers")
    if type(layers) is not int or layers < 1:
        return None  # nothing to count: check_config names the field
    kinds = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    return [*kinds[:-1], "full_attention"]


# model_type -> field -> its value as transformers reads it from the config's other fields,
# where config.json leaves it out (None: nothing to read it from)
READ_FROM: dict[str, dict[str, Callable[[dict], object]]] = {
    "qwen3_5_moe_text": {"rope_parameters": _rope_from_theta},
    "mistral4": {"rope_parameters": _rope_from_scaling},  # mistral3's text model too
    "mellum": {"rope_parameters": _rope_as_scaling},
    "gemma4_text": {"layer_types": _gemma4_layer_types},
}

# A vision-language model_type -> the model_type of transformers' config class for its
# text_config, where that class is fixed (Kimi K2.5's text model, published as "kimi_k2", is
# transformers' DeepSeek-V3); another's (mistral3's) is its text_config's own model_type
TEXT_MODEL_TYPES = {
    "gemma4": "gemma4_text",
    "kimi_k25": "deepseek_v3",
    "llama4": "llama4_text",
    "minimax_m3_vl": "minimax_m3_vl_text",
    "muse_spark": "muse_spark_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "qwen3_vl_moe": "qwen3_vl_moe_text",
}


# Vision-language model types whose config.json mlx-lm reads as the text model's own where it has
# no text_config (qwen3_5_moe's ModelArgs.from_dict): filled and checked as that text model's
FLAT_AS_TEXT = {"qwen3_5_moe"}


def own_model_type(config: dict) -> object:
    """The model_type config.json's own fields are read as (a flat FLAT_AS_TEXT config's: its
    text model's)."""
    model_type = config.get("model_type")
    if model_type in FLAT_AS_TEXT and "text_config" not in config:
        return TEXT_MODEL_TYPES[model_type]
    return model_type


def text_model_type(config: dict) -> str | None:
    """The model_type transformers reads a vision-language config's text_config as (None: the
    config has no text_config)."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        return None
    return TEXT_MODEL_TYPES.get(config.get("model_type"), text.get("model_type"))


def fill_defaults(config: dict) -> dict:
    """`config` with the fields of FILLED and READ_FROM it leaves out set as transformers sets
    them, in a vision-language model's text_config (or its flat config) too."""
    config = _filled(config, own_model_type(config))
    kind = text_model_type(config)
    if kind is not None:
        text = _filled(config["text_config"], kind)
        if text is not config["text_config"]:
            config = {**config, "text_config": text}
    return config


def _filled(values: dict, model_type: object) -> dict:
    fills = required_fills(values, model_type) | FILLED.get(model_type, {})
    missing = {
        field: value
        for field, value in fills.items()
        if not _given(values, field) and not _given(values, WRITTEN_AS.get(field))
    }
    for field, read in READ_FROM.get(model_type, {}).items():
        if not _given(values, field) and (value := read(values)) is not None:
            missing[field] = value
    return {**values, **missing} if missing else values


def _given(values: dict, field: str | None) -> bool:
    """Whether `values` sets `field` as transformers reads it (NULL_IS_ABSENT's null: no)."""
    if field in NULL_IS_ABSENT:
        return values.get(field) is not None
    if field in ("rope_theta", "partial_rotary_factor"):  # or in (each kind's) rope_parameters
        rope = values.get("rope_parameters")
        written = [rope, *rope.values()] if isinstance(rope, dict) else []
        return field in values or any(isinstance(r, dict) and field in r for r in written)
    return field in values
