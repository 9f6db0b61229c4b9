"""Tiny checkpoints in the exact on-disk formats people download, with random weights.

Used by `streamer demo`, the tests and the benchmarks (no machine here can download a model).
Weights are named as Hugging Face publishes them (per-expert tensors, Mixtral's w1/w2/w3), written
as sharded safetensors with an index, next to a config.json in transformers-4 spelling and a real
byte-level BPE tokenizer trained on text that ships with Python.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from .architectures import SUPPORTED, build_model, expert_containers
from .io.safetensors import write_safetensors

VOCAB_SIZE = 512
EOS = "<|endoftext|>"
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
}
assert set(TINY_CONFIGS) == set(SUPPORTED)


def tiny_config(model_type: str, **overrides) -> dict:
    return {"model_type": model_type, "torch_dtype": "bfloat16", **TINY_CONFIGS[model_type], **overrides}


def hf_tensors(config: dict, seed: int = 0, router_scale: float = 8.0):
    """Yield (HF name, numpy array) for every weight of `config`'s model, layer by layer, named and laid
    out as the family's published Hugging Face checkpoints are (float32 values; gpt-oss experts MXFP4).

    Router weights are scaled by `router_scale` so top-k choices are decisive, not near-ties.
    """
    model_type = config["model_type"]
    model = build_model(config, "synthetic config")
    containers = expert_containers(model)
    arch = SUPPORTED[model_type]
    hf_names = {mlx: hf for hf, mlx in arch.hf_projections.items()}
    rng = np.random.default_rng(seed)
    fused: dict[str, dict[str, np.ndarray]] = {}
    for name, param in tree_flatten(model.parameters()):
        shape = tuple(param.shape)
        container = next((c for c in containers if name.startswith(c + ".")), None)
        if container is None:
            yield from _hf_resident(config, name, _init(rng, name, shape, router_scale), rng)
            continue
        parent = _hf_name(container.rsplit(".", 1)[0])
        if arch.hf_fused:
            fused.setdefault(parent, {})[name[len(container) + 1 :]] = _init(rng, name, shape, router_scale)
            continue
        proj, kind = name[len(container) + 1 :].split(".")
        for expert in range(shape[0]):
            yield f"{parent}.experts.{expert}.{hf_names[proj]}.{kind}", _init(rng, name, shape[1:], router_scale)
    for parent, stacked in fused.items():
        yield from _FUSED[model_type](parent, stacked)
    yield from _unused_parts(config, rng)


def _hf_name(name: str) -> str:
    """mlx-lm's name -> the Hugging Face name (vision-language checkpoints nest the text model)."""
    if name.startswith("language_model.model."):
        return "model.language_model." + name[len("language_model.model.") :]
    return name.removeprefix("language_model.")


def _hf_resident(config: dict, name: str, array: np.ndarray, rng: np.random.Generator):
    if name.endswith("self_attn.unembed_out.weight"):
        return  # MLA: both halves come from kv_b_proj (mlx-lm's sanitize splits it)
    if name.endswith("self_attn.embed_q.weight"):
        rows = config["num_attention_heads"] * (config["qk_nope_head_dim"] + config["v_head_dim"])
        rank = config["kv_lora_rank"]
        name, array = name.replace("embed_q", "kv_b_proj"), (rng.standard_normal((rows, rank)) / math.sqrt(rank))
    elif name.endswith("conv1d.weight"):
        array = array.transpose(0, 2, 1)  # torch's Conv1d layout [C, 1, K]; mlx-lm's is [C, K, 1]
    yield _hf_name(name), array.astype(np.float32)


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
        packed[proj] = (weight.reshape(*weight.shape[:2], -1, 16), np.array(scales), stacked[f"{proj}.bias"])
    for kind, gate, up, down in zip(("blocks", "scales", "bias"), packed["gate_proj"], packed["up_proj"], packed["down_proj"]):
        yield f"{parent}.experts.gate_up_proj_{kind}", np.stack([gate, up], axis=2).reshape(gate.shape[0], -1, *gate.shape[2:])
        yield f"{parent}.experts.down_proj_{kind}", down


_FUSED = {"qwen3_5_moe": _qwen3_5_moe_experts, "gpt_oss": _gpt_oss_experts}


def _unused_parts(config: dict, rng: np.random.Generator):
    """Tensors published checkpoints carry that mlx-lm's model drops: multi-token prediction, vision."""
    extras = {
        "glm4_moe": [f"model.layers.{config.get('num_hidden_layers')}.{n}" for n in (
            "eh_proj.weight", "enorm.weight", "hnorm.weight", "mlp.experts.0.gate_proj.weight", "mlp.gate.weight")],
        "qwen3_next": ["mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.mlp.experts.0.gate_proj.weight"],
        "qwen3_5_moe": ["mtp.fc.weight", "mtp.layers.0.mlp.experts.gate_up_proj", "model.visual.patch_embed.proj.weight"],
    }
    for name in extras.get(config["model_type"], ()):
        yield name, rng.standard_normal((4, 2, 8) if "experts.gate_up" in name else (2, 8)).astype(np.float32)


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], router_scale: float) -> np.ndarray:
    if name.endswith("norm.weight") or len(shape) == 1 and name.endswith(".weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(shape[-1])
    if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.router.weight")):
        std *= router_scale
    return (std * rng.standard_normal(shape)).astype(np.float32)


def write_hf_checkpoint(folder: Path | str, config: dict, *, dtype: str = "bfloat16", shard_bytes: int = 1 << 20, seed: int = 0) -> Path:
    """A Hugging Face-style checkpoint: config.json, sharded safetensors with an index, tokenizer."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mx_dtype = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}[dtype]
    shards: list[list[tuple[str, mx.array]]] = [[]]
    size = 0
    for name, array in hf_tensors(config, seed):
        tensor = mx.array(array)
        if mx.issubdtype(tensor.dtype, mx.floating):
            tensor = tensor.astype(mx_dtype)
        if size + tensor.nbytes > shard_bytes and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((name, tensor))
        size += tensor.nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        shard_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(folder / shard_name, shard, metadata={"format": "pt"})
        weight_map.update({name: shard_name for name, _ in shard})
    index = {"metadata": {"total_size": sum(t.nbytes for s in shards for _, t in s)}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}, indent=2))
    write_tokenizer(folder)
    return folder


def _training_text() -> list[str]:
    """English prose that ships with every Python: the standard library's docstrings."""
    import argparse, collections, email, functools, http, json as json_module, logging, os, pathlib, re, shutil
    import subprocess, textwrap, threading, unittest, zipfile

    texts = []
    for module in (argparse, collections, email, functools, http, json_module, logging, os, pathlib, re, shutil,
                   subprocess, textwrap, threading, unittest, zipfile):
        for obj in [module, *vars(module).values()]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 40:
                texts.append(doc)
    return texts


def write_tokenizer(folder: Path | str, vocab_size: int = VOCAB_SIZE) -> None:
    """A byte-level BPE tokenizer (GPT-2 style) saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = Path(folder)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, "<|user|>", "<|assistant|>", "<|system|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(), trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": None,
        "pad_token": EOS,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
