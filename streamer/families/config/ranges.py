"""The counts and sizes the engine and the model use, against the ranges a model can have."""

from __future__ import annotations

import math
from collections.abc import Callable

from .field_error import bad_field

# The largest published MoE models have 61-94 layers, hidden sizes up to 16k and 512 experts;
# these bounds leave room for growth while refusing numbers no model can have.
MAX_LAYERS = 1024
MAX_SIZE = 1 << 20
MAX_CONTEXT = 1 << 40
# The model's context, by the names configs give it: DBRX's is max_seq_len (transformers'
# DbrxConfig reads max_position_embeddings as it; mlx-lm's dbrx reads neither).
CONTEXT_FIELDS = ("max_position_embeddings", "max_seq_len")
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
    *CONTEXT_FIELDS,
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

# Whether mlx-lm's router keeps the topk_group best of n_group groups of experts, from n_group,
# topk_group and the config: where n_group > 1, but in these model files (-> the test their
# router makes). Where it does not, neither changes what it computes: bailing_moe's own defaults
# are n_group 1, topk_group 4.
GROUPS_WHEN: dict[str, Callable[[int, int, dict], bool]] = {
    "bailing_hybrid": lambda n, k, _: n > k,  # it drops n_group - topk_group groups, if any
    "dots1": lambda n, k, _: n != k,
    "bailing_moe_v3": lambda n, k, _: True,
    "deepseek_v2": lambda n, k, config: config.get("topk_method") == "group_limited_greedy",
}
# Routers that compute n_group - topk_group at every token (the others where they group)
READS_TOPK_GROUP = {"bailing_hybrid", "dots1", "bailing_moe_v3"}


def null_computed(name: str, config: dict, model_file: str) -> bool:
    """Whether mlx-lm's `model_file` model computes with a null `name` (n_group, topk_group or
    routed_scaling_factor) where config.json gives one, which replaces its args' default: a
    TypeError at the first routed token. MiMo-V2-Flash's router reads a null scale as 1.0;
    DeepSeek-V2's reads its groups under group_limited_greedy only."""
    if name == "routed_scaling_factor":
        return model_file != "mimo_v2_flash"
    if model_file == "deepseek_v2":
        return config.get("topk_method") == "group_limited_greedy"
    groups = config.get("n_group", 1)  # left out: one group, the default where it is read so
    return name == "n_group" or model_file in READS_TOPK_GROUP or type(groups) is int and groups > 1


# Its routers that score a group by its best expert; every other by its two best, so that groups
# of one fail at the first token (mlx-lm's topk ValueError, transformers' alike)
SCORED_BY_ONE = {"deepseek_v2"}


def check_ranges(config: dict, where, prefix: str, model_file: str | None = None) -> None:
    """The counts and sizes of `config` (`prefix` names its section); `model_file`: the mlx-lm
    model file it runs on where known (else its model_type), whose router reads the groups."""

    def integer(name: str, low: int, high: int, want: str) -> None:
        value = config.get(name)
        if value is None or isinstance(value, list):
            return  # per-layer lists (mimo_v2_flash's moe_layer_freq): typed by the model's args
        if type(value) is not int or not low <= value <= high:
            raise bad_field(where, prefix + name, value, want)

    for name in POSITIVE:
        if name == "sliding_window" and config.get("use_sliding_window") is False:
            continue  # transformers 5 writes 0 for "no window" (Qwen2-MoE)
        high = {"num_hidden_layers": MAX_LAYERS} | dict.fromkeys(CONTEXT_FIELDS, MAX_CONTEXT)
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
        _check_groups(config, where, prefix, experts, model_file or config.get("model_type"))
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


def _check_groups(config: dict, where, prefix: str, experts: object, model_file: object) -> None:
    """n_group and topk_group where mlx-lm's router groups: topk_group of at most n_group groups
    (past it the router drops groups it should keep), which split the routed experts evenly (its
    unflatten's error otherwise), two or more each but in SCORED_BY_ONE."""
    groups, kept = config["n_group"], config["topk_group"]
    for name, value in (("n_group", groups), ("topk_group", kept)):
        if type(value) is not int:  # a list, which the ranges above leave: no router reads one
            raise bad_field(where, prefix + name, value, "an integer from 1")
    if not GROUPS_WHEN.get(model_file, lambda n, k, _: n > 1)(groups, kept, config):
        return
    if kept > groups:
        raise bad_field(where, prefix + "topk_group", kept, f"at most n_group ({groups})")
    routed = config.get("n_routed_experts", experts)  # whatever the family names their count
    if type(routed) is not int:
        return
    if routed % groups:
        raise bad_field(where, prefix + "n_group", groups, "a divisor of the experts")
    if routed < 2 * groups and model_file not in SCORED_BY_ONE:
        want = f"at most {routed // 2} (groups of two or more of the {routed} experts)"
        raise bad_field(where, prefix + "n_group", groups, want)
