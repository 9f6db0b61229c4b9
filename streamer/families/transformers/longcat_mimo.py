"""Fields mlx-lm's LongCat-Flash and MiMo-V2-Flash model args require that transformers 5 does not
write, because its models fix them or derive them from other fields: model_type -> field -> the
value transformers' model computes with (transformers' modeling_longcat_flash.py and
modeling_mimo_v2_flash.py). Merged into transformers_spellings.TRANSFORMERS_FIXED; where
config.json carries WRITTEN_BY_TRANSFORMERS' fields, they replace the hub's spellings of them."""

from __future__ import annotations

from collections.abc import Callable

from ...errors import StreamerError

# transformers' LongcatFlashMLA always scales the q and kv latents by sqrt(hidden / rank) and its
# experts past n_routed_experts are identities; mlx-lm reads no attention_method (the hub's "MLA")
LONGCAT_FLASH: dict[str, Callable[[dict], object]] = {
    "attention_method": lambda _: "MLA",
    "zero_expert_type": lambda _: "identity",
    "mla_scale_q_lora": lambda _: True,
    "mla_scale_kv_lora": lambda _: True,
}


def _mimo_rope(config: dict, layer_type: str, field: str) -> float:
    """rope_parameters' `field` for `layer_type` ("full_attention" or "sliding_attention"), where
    transformers 5 keeps one RoPE per layer type. mlx-lm's model applies plain RoPE to the same
    share of each head in every layer: anything else it cannot compute."""
    kinds = config.get("rope_parameters") or {}
    rope = kinds.get(layer_type) if isinstance(kinds, dict) else None
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        raise StreamerError(
            f"config.json: rope_parameters has no {layer_type!r} entry with a rope_theta; "
            "download config.json again."
        )
    # one entry per layer kind; transformers reads nothing else there (a top-level rope_type was
    # an AttributeError traceback)
    entries = {kind: params for kind, params in kinds.items() if isinstance(params, dict)}
    shares = {  # transformers' default share
        kind: params.get("partial_rotary_factor", 0.334) for kind, params in entries.items()
    }
    types = {params.get("rope_type", "default") for params in entries.values()}
    if types != {"default"} or len(set(shares.values())) != 1:
        raise StreamerError(
            f"config.json: rope_parameters {kinds}: mlx-lm's mimo_v2_flash model computes plain "
            "RoPE over one share of the head in every layer (rope_type 'default', one "
            "partial_rotary_factor); this checkpoint's RoPE is not that, so it is refused."
        )
    return rope["rope_theta"] if field == "rope_theta" else shares[layer_type]


def _layer_flags(config: dict, field: str, kind: str, hub: str) -> list[int]:
    """1 for each layer whose entry in transformers 5's per-layer list `field` is `kind`, where
    config.json has no `hub` (the published config's spelling, which mlx-lm reads)."""
    kinds = _field(config, field, hub)
    if not isinstance(kinds, list) or len(kinds) != config.get("num_hidden_layers"):
        raise StreamerError(
            f"config.json: {field} is not a list of num_hidden_layers layer kinds; download "
            "config.json again."
        )
    return [int(k == kind) for k in kinds]


def _attention_pattern(config: dict) -> list[int]:
    """mlx-lm's hybrid_layer_pattern (1 for a sliding layer) from transformers 5's layer_types.
    mlx-lm's model makes each kind's mask from its first layer of that kind: it needs both."""
    pattern = _layer_flags(config, "layer_types", "sliding_attention", "hybrid_layer_pattern")
    if len(set(pattern)) != 2:
        raise StreamerError(
            f"config.json: layer_types {sorted(set(config['layer_types']))}: mlx-lm's "
            "mimo_v2_flash model needs both sliding and full attention layers (it makes each "
            "kind's mask from its first layer of that kind), so this checkpoint is refused."
        )
    return pattern


def _field(config: dict, name: str, hub: str | None = None):
    """config.json's `name`, which transformers 5 always writes for this family, where it has no
    `hub` (the published config's spelling of it, which mlx-lm reads)."""
    if name not in config:
        said = f"neither {hub!r} (the published spelling) nor {name!r}" if hub else f"no {name!r}"
        raise StreamerError(f"config.json has {said}; download config.json again.")
    return config[name]


# transformers' MiMoV2FlashAttention: the sliding layers have twice the KV heads and attention
# sinks (the full ones none), the same head sizes, and their own RoPE theta; its window of
# `sliding_window` keys counts the query itself, as mlx-lm's sliding_window_size does (so a
# transformers config's 129, the hub's 128 plus the query, is read as 129); a sigmoid router with
# its correction bias and no shared expert
MIMO_V2_FLASH: dict[str, Callable[[dict], object]] = {
    "hybrid_layer_pattern": lambda c: _attention_pattern(c),
    "moe_layer_freq": lambda c: _layer_flags(c, "mlp_layer_types", "sparse", "moe_layer_freq"),
    "add_swa_attention_sink_bias": lambda _: True,
    "add_full_attention_sink_bias": lambda _: False,
    "sliding_window_size": lambda c: _field(c, "sliding_window", "sliding_window_size"),
    "n_shared_experts": lambda _: None,
    "topk_method": lambda _: "noaux_tc",
    "scoring_func": lambda _: "sigmoid",
    "layernorm_epsilon": lambda c: _field(c, "rms_norm_eps", "layernorm_epsilon"),
    "rope_theta": lambda c: _mimo_rope(c, "full_attention", "rope_theta"),
    "swa_rope_theta": lambda c: _mimo_rope(c, "sliding_attention", "rope_theta"),
    "partial_rotary_factor": lambda c: _mimo_rope(c, "full_attention", "partial_rotary_factor"),
    "swa_num_attention_heads": lambda c: _field(c, "num_attention_heads"),
    "swa_num_key_value_heads": lambda c: 2 * _field(c, "num_key_value_heads"),
    "swa_head_dim": lambda c: _field(c, "head_dim"),
    "swa_v_head_dim": lambda c: _field(c, "v_head_dim"),
}


# transformers' defaults for the fields a hub-form config.json (no rope_parameters) leaves out and
# mlx-lm's model args require: its per-layer-kind RoPE (the published bases and share) and its
# router's (the published ones; the hub's null scaling factor is 1.0 to both)
MIMO_V2_FLASH_HUB = {
    "rope_theta": 5000000.0,
    "swa_rope_theta": 10000.0,
    "partial_rotary_factor": 0.334,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
}


# model_type -> fields transformers 5 writes for it and its hub configs do not: where config.json
# has them all, transformers wrote it, and its model computes with its own fields only, whatever
# hub fields a config it read carried through (MiMo-V2-Flash's config class keeps the hub's
# hybrid_layer_pattern, swa_*, rope_theta, sliding_window_size unread: a window of
# sliding_window_size + 1 keys, the default per-type rope_parameters, twice the KV heads), so
# TRANSFORMERS_FIXED's values replace them
WRITTEN_BY_TRANSFORMERS = {
    "mimo_v2_flash": ("layer_types", "mlp_layer_types", "rope_parameters", "sliding_window")
}
