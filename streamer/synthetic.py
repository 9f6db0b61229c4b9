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
    """Yield (HF name, float32 numpy array) for every weight of `config`'s model, layer by layer.

    Router weights are scaled by `router_scale` so top-k choices are decisive, not near-ties.
    """
    model = build_model(config, "synthetic config")
    containers = expert_containers(model)
    hf_names = {mlx: hf for hf, mlx in SUPPORTED[config["model_type"]].hf_projections.items()}
    rng = np.random.default_rng(seed)
    for name, param in tree_flatten(model.parameters()):
        shape = tuple(param.shape)
        container = next((c for c in containers if name.startswith(c + ".")), None)
        if container is None:
            yield name, _init(rng, name, shape, router_scale)
            continue
        proj, kind = name[len(container) + 1 :].split(".")
        parent = container.rsplit(".", 1)[0]
        for expert in range(shape[0]):
            yield f"{parent}.experts.{expert}.{hf_names[proj]}.{kind}", _init(rng, name, shape[1:], router_scale)


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], router_scale: float) -> np.ndarray:
    if name.endswith("norm.weight") or len(shape) == 1 and name.endswith(".weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(shape[-1])
    if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
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
        tensor = mx.array(array).astype(mx_dtype)
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
