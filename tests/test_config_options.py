"""Config options the family fixtures leave at one value, set otherwise: which layers are MoE,
how many experts a token routes to and how their scores are made and combined, tied embeddings,
expert counts that are not a power of two. Each streams exactly as mlx-lm's resident model computes
on the same weights, in bf16 and in MLX 4-bit, repacked and read in place, on both read paths
(test_parity.compare: a budget of 0, so the slot pool misses)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import mlx_lm
import pytest
from conftest import reference_model
from test_parity import compare

from fixtures import tiny_config, write_hf_checkpoint
from streamer.families.expert_lists import STACKED_MODELS
from streamer.families.model_types import mlx_lm_model_type
from streamer.repack import Quantize, repack

# (model_type, config fields set otherwise than its fixture's, as far as its model args read them)
OPTIONS = [
    # every expert routed: a slot pool of one layer's experts holds them all at once
    ("qwen3_moe", {"num_experts_per_tok": 16, "norm_topk_prob": False}),
    # 6 experts, one a token; the lm_head tied to the embeddings
    ("mixtral", {"num_local_experts": 6, "num_experts_per_tok": 1, "tie_word_embeddings": True}),
    # DeepSeek's dense layers between MoE layers (every second), 12 experts in 4 groups, tied
    # embeddings on a model mlx-lm gives an lm_head of its own
    (
        "deepseek_v3",
        {
            "num_hidden_layers": 5,
            "moe_layer_freq": 2,
            "n_routed_experts": 12,
            "tie_word_embeddings": True,
        },
    ),
    ("deepseek_v2", {"topk_method": "greedy", "routed_scaling_factor": 2.0}),
    # group-limited routing, no renormalized top-k, no dense first layer
    (
        "glm4_moe",
        {"n_group": 4, "topk_group": 2, "norm_topk_prob": False, "first_k_dense_replace": 0},
    ),
    # ERNIE's MoE layers from the first, every second, no shared expert
    (
        "ernie4_5_moe",
        {
            "num_hidden_layers": 4,
            "moe_layer_start_index": 0,
            "moe_layer_interval": 2,
            "moe_num_shared_experts": 0,
        },
    ),
    (
        "kimi_linear",
        {
            "first_k_dense_replace": 0,
            "moe_layer_freq": 2,
            "num_shared_experts": 0,
            "moe_renormalize": False,
        },
    ),
    ("step3p5", {"moe_layers_enum": "0,2", "norm_expert_weight": False}),
    (
        "nemotron_h",
        {
            "hybrid_override_pattern": ["E", "M", "E", "*"],
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": False,
        },
    ),
    # softmax scores, no renormalization, every layer MoE
    ("afmoe", {"num_dense_layers": 0, "score_func": "softmax", "route_norm": False}),
    (
        "bailing_moe",
        {
            "first_k_dense_replace": 0,
            "score_function": "softmax",
            "n_group": 1,
            "topk_group": 1,
            "moe_router_enable_expert_bias": False,
            "norm_topk_prob": False,
        },
    ),
    ("gemma4_text", {"num_experts": 12, "top_k_experts": 1}),
]


@pytest.mark.parametrize("arch, fields", OPTIONS, ids=[f"{a}-{'-'.join(f)}" for a, f in OPTIONS])
def test_config_option_streams_as_mlx_lm_computes(tmp_path, arch, fields):
    config = tiny_config(arch, **fields)
    hf = write_hf_checkpoint(tmp_path / "hf", config)
    compare(repacked(hf, tmp_path / "bf16"), reference_model(hf), 1e-4)
    mlx = tmp_path / "mlx"
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(str(hf), str(mlx), quantize=True, q_bits=4, q_group_size=64)
    reference = reference_model(mlx)
    compare(repacked(mlx, tmp_path / "q4"), reference, 0.0)
    # quantized while repacking, as mlx_lm.convert quantizes
    compare(repacked(hf, tmp_path / "quantized", quantize=Quantize(4, 64)), reference, 0.0)
    if mlx_lm_model_type(config) not in STACKED_MODELS:
        compare(mlx, reference, 0.0)  # in place, no repack


def repacked(src: Path, dst: Path, **kwargs) -> Path:
    repack(src, dst, log=lambda _: None, **kwargs)
    return dst
