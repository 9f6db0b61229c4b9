"""Fields mlx-lm's ModelArgs requires (it declares no default) where transformers' config class
gives one: filled with transformers' default where config.json leaves them out.

A published or trimmed config.json may leave a field out because the library default applies;
mlx-lm then refused to build the model (`ModelArgs.__init__() missing 1 required positional
argument: 'rms_norm_eps'`). Filled: fields that are not a size, a count or a layer layout: norm
epsilons, RoPE bases, routing scales and groups, multipliers, windows, and the bias and tying
switches (a bias the weights do not hold, or lack, is refused by their names). Left required:
sizes, expert counts and the experts a token routes to, the context (max_position_embeddings: a
small library default would refuse prompts the model reads), layer layouts
(first_k_dense_replace, decoder_sparse_step, layer_types) and the fields of families
transformers has no class for (Klear, bailing_moe, bailing_moe_linear, hunyuan,
longcat_flash_ngram).
tests/test_required_defaults.py checks each value against transformers' class, that mlx-lm's
args require the field, and that every streaming family's other required fields are of the kinds
left required. Where mlx-lm has a default that differs, defaults.FILLED decides.
"""

from __future__ import annotations

# transformers' model_type (a vision-language model's text model's) -> field -> its default
REQUIRED_FILLED: dict[str, dict[str, object]] = {
    "bailing_hybrid": {
        "rms_norm_eps": 1e-6,
        "rope_theta": 6000000.0,
        "routed_scaling_factor": 2.5,
        "n_group": 8,
        "topk_group": 4,
    },
    "dots1": {"rms_norm_eps": 1e-6, "norm_topk_prob": False, "routed_scaling_factor": 1.0},
    "ernie4_5_moe": {"rms_norm_eps": 1e-5, "use_bias": False, "tie_word_embeddings": True},
    "exaone_moe": {"rms_norm_eps": 1e-5, "sliding_window": 4096},
    "glm4_moe": {
        "rms_norm_eps": 1e-5,
        "partial_rotary_factor": 0.5,
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "use_qk_norm": False,
        "attention_bias": False,
        "tie_word_embeddings": False,
    },
    "glm_moe_dsa": {
        "rms_norm_eps": 1e-5,
        "index_topk": 2048,
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
        "attention_bias": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "granitemoe": {
        "rms_norm_eps": 1e-6,
        "embedding_multiplier": 1.0,
        "attention_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "logits_scaling": 1.0,
        "attention_bias": False,
    },
    "granitemoehybrid": {
        "rms_norm_eps": 1e-6,
        "embedding_multiplier": 1.0,
        "attention_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "logits_scaling": 1.0,
        "attention_bias": False,
    },
    "jamba": {"rms_norm_eps": 1e-6},
    "kimi_linear": {"rms_norm_eps": 1e-5},
    "lfm2_moe": {
        "norm_eps": 1e-5,
        "norm_topk_prob": True,
        "use_expert_bias": True,
        "conv_bias": False,
    },
    "longcat_flash": {"rms_norm_eps": 1e-5, "routed_scaling_factor": 6.0, "attention_bias": False},
    "mellum": {
        "rms_norm_eps": 1e-6,
        "norm_topk_prob": True,
        "sliding_window": 1024,
        "tie_word_embeddings": False,
    },
    "minimax": {"rms_norm_eps": 1e-5},
    "mistral4": {  # mistral3's text model too
        "rms_norm_eps": 1e-6,
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
    },
    "nemotron_h": {
        "layer_norm_epsilon": 1e-5,
        "attention_bias": False,
        "mlp_bias": False,
        "use_bias": False,
        "mamba_proj_bias": False,
        "use_conv_bias": True,
    },
    "olmoe": {"rms_norm_eps": 1e-5},
    "qwen2_moe": {"rms_norm_eps": 1e-6},
    "qwen3_moe": {"rms_norm_eps": 1e-6, "norm_topk_prob": False, "tie_word_embeddings": False},
    "qwen3_next": {"rms_norm_eps": 1e-6, "partial_rotary_factor": 0.25},
    "solar_open": {
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "tie_word_embeddings": False,
    },
    "llama4_text": {
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "attention_bias": False,
        "attention_chunk_size": 8192,
        "use_qk_norm": True,
    },
    "muse_spark_text": {
        "rms_norm_eps": 1e-5,
        "post_norm_eps": 1e-8,
        "sliding_window": 2048,
        "final_logit_softcapping": 20.0,
        "output_multiplier": 0.1767766952966369,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    },
    "qwen3_vl_moe_text": {"rms_norm_eps": 1e-6, "rope_theta": 500000.0},
}


def required_fills(values: dict, model_type: object) -> dict:
    """REQUIRED_FILLED's fields for `model_type`; its default rope_parameters with the config's
    own rope_theta where it gives one (transformers 4's spelling, which transformers reads into
    them: mlx-lm reads the base from rope_parameters alone)."""
    fills = dict(REQUIRED_FILLED.get(model_type, {}))
    if "rope_parameters" in fills and "rope_theta" in values:
        fills["rope_parameters"] = {**fills["rope_parameters"], "rope_theta": values["rope_theta"]}
    return fills
