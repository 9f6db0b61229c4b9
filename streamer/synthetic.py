"""Tiny checkpoints in the exact on-disk formats people download, with random weights.

Used by `streamer demo`, the tests and the benchmarks (no machine here can download a model).
Weights are named and laid out as each family publishes them on Hugging Face (per-expert tensors,
Mixtral's w1/w2/w3, MLA's kv_b_proj, Qwen3.5's fused experts, gpt-oss's MXFP4 blocks, optionally
DeepSeek's FP8), written as sharded safetensors with an index, next to a config.json in
transformers-4 spelling and a real byte-level BPE tokenizer trained on text that ships with Python.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from .architectures import architecture, build_model, expert_containers
from .io.safetensors import write_safetensors

VOCAB_SIZE = 512
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_COMMON = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 2048,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "eos_token_id": 0,
    "bos_token_id": 0,
}
TINY_CONFIGS: dict[str, dict] = {
    "qwen3_moe": {
        **_COMMON,
        "architectures": ["Qwen3MoeForCausalLM"],
        "head_dim": 32,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    },
    "mixtral": {
        **_COMMON,
        "architectures": ["MixtralForCausalLM"],
        "intermediate_size": 64,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "qwen2_moe": {
        **_COMMON,
        "architectures": ["Qwen2MoeForCausalLM"],
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 128,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": False,
    },
    "olmoe": {
        **_COMMON,
        "architectures": ["OlmoeForCausalLM"],
        "intermediate_size": 64,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "norm_topk_prob": False,
    },
    "deepseek_v3": {  # DeepSeek-V3 / R1: MLA, grouped sigmoid routing, first layer dense
        **_COMMON,
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "n_routed_experts": 16,
        "n_shared_experts": 1,
        "num_experts_per_tok": 4,
        "n_group": 4,
        "topk_group": 2,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "q_lora_rank": 64,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "rope_theta": 10000.0,
        "max_position_embeddings": 163840,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
        },
    },
    "deepseek_v2": {  # DeepSeek-V2 / V2-Lite: MLA (no q LoRA as in Lite), softmax group-limited greedy routing
        **_COMMON,
        "architectures": ["DeepseekV2ForCausalLM"],
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "n_routed_experts": 16,
        "n_shared_experts": 2,
        "num_experts_per_tok": 4,
        "topk_method": "group_limited_greedy",
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 1.0,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "q_lora_rank": None,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "rope_theta": 10000.0,
        "max_position_embeddings": 163840,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
        },
    },
    "glm4_moe": {  # GLM-4.5 / 4.5-Air: partial rotary, sigmoid routing with correction bias, MTP layer
        **_COMMON,
        "architectures": ["Glm4MoeForCausalLM"],
        "num_hidden_layers": 3,
        "head_dim": 32,
        "partial_rotary_factor": 0.5,
        "attention_bias": True,
        "use_qk_norm": False,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "n_routed_experts": 16,
        "n_shared_experts": 1,
        "num_experts_per_tok": 4,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 1,
        "rope_scaling": None,
    },
    "qwen3_next": {  # Qwen3-Next: gated delta net + gated full attention, shared expert with sigmoid gate
        **_COMMON,
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 4,
        "full_attention_interval": 4,
        "head_dim": 32,
        "partial_rotary_factor": 0.25,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],
    },
    "gpt_oss": {  # gpt-oss as published: MXFP4 experts, attention sinks, alternating sliding window
        **_COMMON,
        "architectures": ["GptOssForCausalLM"],
        "num_hidden_layers": 2,
        "head_dim": 32,
        "intermediate_size": 64,
        "num_local_experts": 16,
        "num_experts_per_tok": 4,
        "experts_per_token": 4,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
        "attention_bias": True,
        "rope_theta": 150000.0,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        },
    },
}
# Kimi K2 is DeepSeek-V3 (one routing group). No rope_scaling here: transformers cannot read a kimi_k2
# config.json that has one without the checkpoint's own code (trust_remote_code), even for the tokenizer.
TINY_CONFIGS["kimi_k2"] = {
    **{k: v for k, v in TINY_CONFIGS["deepseek_v3"].items() if k != "rope_scaling"},
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.827,
}
TINY_CONFIGS["glm4_moe_lite"] = {  # GLM-4.7-Flash: DeepSeek-V3's MLA and routing, GLM's MTP layer
    **{k: v for k, v in TINY_CONFIGS["deepseek_v3"].items() if k != "rope_scaling"},
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.8,
    "partial_rotary_factor": 1.0,
    "num_nextn_predict_layers": 1,
}
_DSA = {
    "index_head_dim": 32,
    "index_n_heads": 4,
    "index_topk": 16,
}  # sparse attention beyond 16 tokens
TINY_CONFIGS["deepseek_v32"] = {
    **TINY_CONFIGS["deepseek_v3"],
    **_DSA,
    "architectures": ["DeepseekV32ForCausalLM"],
}
TINY_CONFIGS["glm_moe_dsa"] = {  # GLM-5: DeepSeek-V3.2's sparse attention
    **{
        k: v
        for k, v in TINY_CONFIGS["deepseek_v3"].items()
        if k not in ("rope_scaling", "rope_theta")
    },
    **_DSA,
    "architectures": ["GlmMoeDsaForCausalLM"],
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "attention_bias": False,
    "num_nextn_predict_layers": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}
TINY_CONFIGS[
    "qwen3_5_moe"
] = {  # Qwen3.5 MoE: a vision-language checkpoint; mlx-lm runs its text model
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "tie_word_embeddings": False,
    "eos_token_id": 0,
    "text_config": {
        **{
            k: v
            for k, v in TINY_CONFIGS["qwen3_next"].items()
            if k not in ("architectures", "rope_theta", "mlp_only_layers")
        },
        "model_type": "qwen3_5_moe_text",
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    },
    "vision_config": {
        "model_type": "qwen3_5_moe",
        "depth": 1,
        "hidden_size": 32,
        "out_hidden_size": 128,
    },
}
# One tiny config per further family, as data (fixtures/configs/<model_type>.json).
CONFIG_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
for _path in sorted(CONFIG_DIR.glob("*.json")):
    TINY_CONFIGS[_path.stem] = json.loads(_path.read_text())


def tiny_config(model_type: str, **overrides) -> dict:
    return {
        "model_type": model_type,
        "torch_dtype": "bfloat16",
        **TINY_CONFIGS[model_type],
        **overrides,
    }


def hf_tensors(config: dict, seed: int = 0, router_scale: float = 8.0):
    """Yield (HF name, numpy array) for every weight of `config`'s model, layer by layer, named and laid
    out as the family's published Hugging Face checkpoints are (float32 values; gpt-oss experts MXFP4).

    Router weights are scaled by `router_scale` so top-k choices are decisive, not near-ties.
    """
    model_type = config["model_type"]
    model = build_model(config, "synthetic config")
    containers = expert_containers(model)
    arch = architecture(config, "synthetic config")
    hf_names = {mlx: hf for hf, mlx in arch.hf_projections.items()}
    rng = np.random.default_rng(seed)
    fused: dict[str, dict[str, np.ndarray]] = {}
    for name, param in tree_flatten(model.parameters()):
        shape = tuple(param.shape)
        container = next((c for c in containers if name.startswith(c + ".")), None)
        if container is None:
            yield from _hf_resident(config, name, _init(rng, name, shape, router_scale), rng)
            continue
        parent = _hf_name(arch.hf_parent(container), model_type)
        if model_type in _FUSED:
            fused.setdefault(parent, {})[name[len(container) + 1 :]] = _init(
                rng, name, shape, router_scale
            )
            continue
        proj, kind = name[len(container) + 1 :].split(".")
        for expert in range(shape[0]):
            yield (
                f"{parent}.{arch.hf_experts}.{expert}.{hf_names[proj]}.{kind}",
                _init(rng, name, shape[1:], router_scale),
            )
    for parent, stacked in fused.items():
        yield from _FUSED[model_type](parent, stacked)
    yield from _unused_parts(config, rng)


# vision-language checkpoints whose text model keeps mlx-lm's `language_model.model.` names
_TEXT_AS_MLX_LM = ("llama4",)


def _hf_name(name: str, model_type: str = "") -> str:
    """mlx-lm's name -> the Hugging Face name (vision-language checkpoints nest the text model)."""
    if model_type in _TEXT_AS_MLX_LM:
        return name
    if name.startswith("language_model.model."):
        return "model.language_model." + name[len("language_model.model.") :]
    return name.removeprefix("language_model.")


def _hf_resident(config: dict, name: str, array: np.ndarray, rng: np.random.Generator):
    if name.endswith("self_attn.unembed_out.weight"):
        return  # MLA: both halves come from kv_b_proj (mlx-lm's sanitize splits it)
    if name.endswith("self_attn.embed_q.weight"):
        rows = config["num_attention_heads"] * (config["qk_nope_head_dim"] + config["v_head_dim"])
        rank = config["kv_lora_rank"]
        name, array = (
            name.replace("embed_q", "kv_b_proj"),
            (rng.standard_normal((rows, rank)) / math.sqrt(rank)),
        )
    elif name.endswith("conv1d.weight"):
        array = array.transpose(0, 2, 1)  # torch's Conv1d layout [C, 1, K]; mlx-lm's is [C, K, 1]
    yield _hf_name(name, config["model_type"]), array.astype(np.float32)


def _qwen3_5_moe_experts(parent: str, stacked: dict[str, np.ndarray]):
    gate_up = np.concatenate([stacked["gate_proj.weight"], stacked["up_proj.weight"]], axis=1)
    yield f"{parent}.experts.gate_up_proj", gate_up
    yield f"{parent}.experts.down_proj", stacked["down_proj.weight"]


def _gpt_oss_experts(parent: str, stacked: dict[str, np.ndarray]):
    """MXFP4 blocks and scales as OpenAI publishes them; gate and up rows interleaved."""
    packed = {}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        weight, scales = mx.quantize(mx.array(stacked[f"{proj}.weight"]), 32, 4, mode="mxfp4")
        weight = np.array(weight).view(np.uint8)
        packed[proj] = (
            weight.reshape(*weight.shape[:2], -1, 16),
            np.array(scales),
            stacked[f"{proj}.bias"],
        )
    for kind, gate, up, down in zip(
        ("blocks", "scales", "bias"), packed["gate_proj"], packed["up_proj"], packed["down_proj"]
    ):
        yield (
            f"{parent}.experts.gate_up_proj_{kind}",
            np.stack([gate, up], axis=2).reshape(gate.shape[0], -1, *gate.shape[2:]),
        )
        yield f"{parent}.experts.down_proj_{kind}", down


def _granitemoe_experts(parent: str, stacked: dict[str, np.ndarray]):
    """Granite MoE: gate and up stacked in `input_linear` [E, 2I, H], down in `output_linear`."""
    gate_up = np.concatenate([stacked["gate_proj.weight"], stacked["up_proj.weight"]], axis=1)
    yield f"{parent}.input_linear.weight", gate_up
    yield f"{parent}.output_linear.weight", stacked["down_proj.weight"]


def _llama4_experts(parent: str, stacked: dict[str, np.ndarray]):
    """Llama 4: `experts.gate_up_proj` [E, H, 2I] (inputs first), `experts.down_proj` [E, I, H]."""
    gate_up = np.concatenate([stacked["gate_proj.weight"], stacked["up_proj.weight"]], axis=1)
    yield f"{parent}.experts.gate_up_proj", gate_up.transpose(0, 2, 1)
    yield f"{parent}.experts.down_proj", stacked["down_proj.weight"].transpose(0, 2, 1)


def _gemma4_experts(parent: str, stacked: dict[str, np.ndarray]):
    """Gemma 4: `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I]."""
    yield from (
        (n.replace(".experts.experts.", ".experts."), a)
        for n, a in _qwen3_5_moe_experts(parent, stacked)
    )


def _step3p5_experts(parent: str, stacked: dict[str, np.ndarray]):
    """Step 3.5: stacked [E, out, in] under `moe.{gate,up,down}_proj.weight`."""
    layer = parent.rsplit(".", 1)[0]
    for proj in ("gate_proj", "up_proj", "down_proj"):
        yield f"{layer}.moe.{proj}.weight", stacked[f"{proj}.weight"]


_FUSED = {
    "qwen3_5_moe": _qwen3_5_moe_experts,
    "gpt_oss": _gpt_oss_experts,
    "granitemoe": _granitemoe_experts,
    "granitemoehybrid": _granitemoe_experts,
    "llama4": _llama4_experts,
    "gemma4_text": _gemma4_experts,
    "step3p5": _step3p5_experts,
}


_MTP_LAYER = (
    "eh_proj.weight",
    "enorm.weight",
    "hnorm.weight",
    "mlp.gate.weight",
    "mlp.experts.0.gate_proj.weight",
)


def _unused_parts(config: dict, rng: np.random.Generator):
    """Tensors published checkpoints carry that mlx-lm's model drops: multi-token prediction, vision."""
    model_type = config["model_type"]
    names: list[str] = []
    if model_type in (
        "glm4_moe",
        "glm4_moe_lite",
        "glm_moe_dsa",
        "deepseek_v32",
    ):  # an MTP layer after the last
        names = [f"model.layers.{config['num_hidden_layers']}.{n}" for n in _MTP_LAYER]
    elif model_type == "qwen3_next":
        names = ["mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.mlp.experts.0.gate_proj.weight"]
    elif model_type == "qwen3_5_moe":
        names = [
            "mtp.fc.weight",
            "mtp.layers.0.mlp.experts.gate_up_proj",
            "model.visual.patch_embed.proj.weight",
        ]
    for name in names:
        yield (
            name,
            rng.standard_normal(
                (4, 2, 8) if name.endswith("experts.gate_up_proj") else (2, 8)
            ).astype(np.float32),
        )


def _init(
    rng: np.random.Generator, name: str, shape: tuple[int, ...], router_scale: float
) -> np.ndarray:
    if name.endswith("norm.weight") or len(shape) == 1 and name.endswith(".weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(shape[-1])
    if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.router.weight")):
        std *= router_scale
    return (std * rng.standard_normal(shape)).astype(np.float32)


FP8_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def write_hf_checkpoint(
    folder: Path | str,
    config: dict,
    *,
    dtype: str = "bfloat16",
    fp8: bool = False,
    shard_bytes: int = 1 << 20,
    seed: int = 0,
) -> Path:
    """A Hugging Face-style checkpoint: config.json, sharded safetensors with an index, tokenizer.

    `fp8`: linear weights in FP8 with 128x128 block scales, as DeepSeek and Kimi publish theirs.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mx_dtype = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}[dtype]
    shards: list[list[tuple[str, mx.array]]] = [[]]
    size = 0
    f8: set[str] = set()
    for name, array in hf_tensors(config, seed):
        if fp8 and name.endswith(("_proj.weight", "_proj_with_mqa.weight")):
            tensors = list(zip((name, f"{name}_scale_inv"), _fp8_blocks(array)))
            f8.add(name)
        else:
            tensor = mx.array(array)
            tensors = [
                (
                    name,
                    tensor.astype(mx_dtype) if mx.issubdtype(tensor.dtype, mx.floating) else tensor,
                )
            ]
        for name, tensor in tensors:
            if size + tensor.nbytes > shard_bytes and shards[-1]:
                shards.append([])
                size = 0
            shards[-1].append((name, tensor))
            size += tensor.nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        shard_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(
            folder / shard_name,
            shard,
            metadata={"format": "pt"},
            dtypes=dict.fromkeys(f8, "F8_E4M3"),
        )
        weight_map.update({name: shard_name for name, _ in shard})
    index = {
        "metadata": {"total_size": sum(t.nbytes for s in shards for _, t in s)},
        "weight_map": weight_map,
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {
        **config,
        "torch_dtype": dtype,
        **({"quantization_config": FP8_CONFIG} if fp8 else {}),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(folder)
    return folder


def _fp8_blocks(weight: np.ndarray) -> tuple[mx.array, mx.array]:
    """e4m3 weight and its float32 `weight_scale_inv`, one scale per 128x128 block."""
    rows, cols = (-(-n // 128) for n in weight.shape)
    padded = np.zeros((rows * 128, cols * 128), np.float32)
    padded[: weight.shape[0], : weight.shape[1]] = weight
    blocks = padded.reshape(rows, 128, cols, 128)
    scale = np.abs(blocks).max(axis=(1, 3)) / 448.0  # 448: e4m3's largest value
    scaled = (blocks / scale[:, None, :, None]).reshape(padded.shape)[
        : weight.shape[0], : weight.shape[1]
    ]
    return mx.to_fp8(mx.array(scaled)), mx.array(scale.astype(np.float32))


def _training_text() -> list[str]:
    """English prose that ships with every Python: the standard library's docstrings."""
    import argparse
    import collections
    import email
    import functools
    import http
    import json as json_module
    import logging
    import os
    import pathlib
    import re
    import shutil
    import subprocess
    import textwrap
    import threading
    import unittest
    import zipfile

    texts = []
    for module in (
        argparse,
        collections,
        email,
        functools,
        http,
        json_module,
        logging,
        os,
        pathlib,
        re,
        shutil,
        subprocess,
        textwrap,
        threading,
        unittest,
        zipfile,
    ):
        for obj in [module, *vars(module).values()]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 40:
                texts.append(doc)
    return texts


def train_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2 style) with SPECIAL_TOKENS, trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def write_tokenizer(folder: Path | str, vocab_size: int = VOCAB_SIZE) -> None:
    """The synthetic tokenizer saved as tokenizer.json + tokenizer_config.json."""
    folder = Path(folder)
    (folder / "tokenizer.json").write_text(_trained_tokenizer(vocab_size))
    write_tokenizer_config(folder, 2048)


@functools.cache
def _trained_tokenizer(vocab_size: int) -> str:
    """Training is deterministic: once per process is enough."""
    return train_bpe(_training_text(), vocab_size).to_str()


def write_tokenizer_config(folder: Path, max_length: int) -> None:
    """tokenizer_config.json for a tokenizer.json made with the `tokenizers` library."""
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": None,
        "pad_token": EOS,
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
