"""The counts and sizes the engine and the model use, against the ranges a model can have."""

from __future__ import annotations

import math

from .field_error import bad_field

# The largest published MoE models have 61-94 layers, hidden sizes up to 16k and 512 experts;
# these bounds leave room for growth while refusing numbers no model can have.
MAX_LAYERS = 1024
MAX_SIZE = 1 << 20
MAX_CONTEXT = 1 << 40
# Counts and sizes that must be at least 1 where a config gives them.
POSITIVE = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "max_position_embeddings",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "n_group",
    "topk_group",
    "decoder_sparse_step",
    "moe_layer_freq",
    "index_head_dim",
    "index_n_heads",
    "index_topk",
    "linear_num_value_heads",
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "full_attention_interval",
    "sliding_window",
)
NON_NEGATIVE = (
    "first_k_dense_replace",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "num_nextn_predict_layers",
)
# How the families name their expert count and routed experts per token (the model's own build
# refuses a config with neither; a model with no expert layers is refused by architectures).
EXPERT_COUNTS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_num_experts",
)
TOP_K = (
    "num_experts_per_tok",
    "num_experts_per_token",
    "moe_k",
    "moe_topk",
    "moe_top_k",
    "top_k_experts",
)
# String fields mlx-lm's models read only when they route a token, raising there (mid-generation,
# after a repack wrote them) for any other value: model_type -> field -> the values they compute.
CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "laguna": {"moe_router_score_func": ("sigmoid", "sqrtsoftplus")},
    "kimi_linear": {"moe_router_activation_func": ("sigmoid", "softmax")},
    "longcat_flash": {"zero_expert_type": ("identity",)},
    "longcat_flash_ngram": {"zero_expert_type": ("identity",)},
}


def check_ranges(config: dict, where, prefix: str) -> None:
    def integer(name: str, low: int, high: int, want: str) -> None:
        value = config.get(name)
        if value is None or isinstance(value, list):
            return  # per-layer lists (mimo_v2_flash's moe_layer_freq): typed by the model's args
        if type(value) is not int or not low <= value <= high:
            raise bad_field(where, prefix + name, value, want)

    for name in POSITIVE:
        if name == "sliding_window" and config.get("use_sliding_window") is False:
            continue  # transformers 5 writes 0 for "no window" (Qwen2-MoE)
        high = {"num_hidden_layers": MAX_LAYERS, "max_position_embeddings": MAX_CONTEXT}
        integer(
            name, 1, high.get(name, MAX_SIZE), f"an integer from 1 to {high.get(name, MAX_SIZE)}"
        )
    for name in NON_NEGATIVE:
        integer(name, 0, MAX_SIZE, f"an integer from 0 to {MAX_SIZE}")
    experts = next((config[n] for n in EXPERT_COUNTS if config.get(n) is not None), None)
    top_k = next((n for n in TOP_K if config.get(n) is not None), None)
    if type(experts) is int and top_k is not None and type(config[top_k]) is int:
        integer(top_k, 1, experts, f"an integer from 1 to the {experts} experts")
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        raise bad_field(
            where, prefix + "num_key_value_heads", kv_heads, f"a divisor of {heads} heads"
        )
    if config.get("n_group") and config.get("topk_group"):
        integer("topk_group", 1, config["n_group"], f"at most n_group ({config['n_group']})")
        # the groups split the routed experts evenly, whatever the family names their count
        routed = config.get("n_routed_experts", experts)
        if type(routed) is int and routed % config["n_group"]:
            raise bad_field(
                where, prefix + "n_group", config["n_group"], "a divisor of the experts"
            )
        # every grouped router but DeepSeek-V2's (the group's best) scores a group by its two best
        # experts: groups of one fail at the first token, in mlx-lm and transformers alike
        if type(routed) is int and config["n_group"] > 1 and routed < 2 * config["n_group"]:
            if config.get("model_type") != "deepseek_v2":
                want = f"at most {routed // 2} (groups of two or more of the {routed} experts)"
                raise bad_field(where, prefix + "n_group", config["n_group"], want)
    for name, values in CHOICES.get(config.get("model_type"), {}).items():
        if name in config and config[name] not in values:
            want = " or ".join(map(repr, values)) + " (what mlx-lm's model computes)"
            raise bad_field(where, prefix + name, config[name], want)
    for name in ("rms_norm_eps", "rope_theta", "routed_scaling_factor"):
        value = config.get(name)
        if value is not None and not (type(value) in (int, float) and 0 < value < math.inf):
            raise bad_field(where, prefix + name, value, "a positive finite number")
    factor = config.get("partial_rotary_factor")
    if factor is not None and not (type(factor) in (int, float) and 0 < factor <= 1):
        raise bad_field(where, prefix + "partial_rotary_factor", factor, "a number in (0, 1]")
    layers = config.get("num_hidden_layers")
    for name in ("mlp_only_layers",):
        value = config.get(name)
        if value is not None and not (
            isinstance(value, list)
            and all(type(v) is int and 0 <= v < (layers or 1) for v in value)
        ):
            raise bad_field(where, prefix + name, value, f"a list of layer numbers below {layers}")
    interval = config.get("full_attention_interval")  # Qwen3-Next's, Qwen3.5's: typed above
    if type(interval) is int and type(layers) is int and interval > layers:
        # mlx-lm's model masks its attention from layer interval - 1's cache: an IndexError
        want = f"at most num_hidden_layers ({layers}): the model needs a full attention layer"
        raise bad_field(where, prefix + "full_attention_interval", interval, want)
    types = config.get("layer_types")
    if types is not None and not (
        isinstance(types, list)
        and len(types) >= (layers or 0)
        and all(isinstance(t, str) for t in types)
    ):
        raise bad_field(
            where, prefix + "layer_types", types, f"a list of {layers} layer type names"
        )
