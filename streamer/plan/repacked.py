"""The plan of a repacked folder from its own files, without mlx-lm (which takes seconds to
import): the manifest's layers and records, the expert files' sizes, the resident file's
safetensors header, and config.json's attention sizes for the families whose KV cache is a plain
function of them (tests/test_plan.py checks each against the model-built plan)."""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx

from ..families.config import (
    check_repacked_config_json,
    check_sizes,
    context_length,
    experts_per_token,
)
from ..io.expert_layout import repacked_layout
from ..io.integrity import file_size
from ..io.manifest import MANIFEST_FILE, RESIDENT_FILE, Manifest, read_manifest
from ..io.safetensors import DTYPES, read_header
from ..loading.residency import LayerShape, layer_shapes
from .report import ModelPlan, fitted

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# The text model's model_type -> how mlx-lm caches its attention: "attention" keeps keys and
# values of num_key_value_heads x head_dim in every layer; "mla" keeps DeepSeek's compressed
# latent (kv_lora_rank) and the RoPE key (qk_rope_head_dim). Families with sliding windows,
# linear attention, shared (CLA) or per-layer caches are planned from mlx-lm's model instead.
KV_LAYOUT = {
    **dict.fromkeys(
        (
            "Klear",
            "bailing_moe",
            "deepseek",
            "dots1",
            "ernie4_5_moe",
            "glm4_moe",
            "granitemoe",
            "minimax",
            "mixtral",
            "olmoe",
            "phimoe",
            "qwen2_moe",
            "qwen3_moe",
            "qwen3_vl_moe_text",
            "solar_open",
        ),
        "attention",
    ),
    **dict.fromkeys(("deepseek_v3", "kimi_k2", "glm4_moe_lite", "mistral4"), "mla"),
}


def kv_bytes_per_token(
    config: dict, dtype_bytes: int, kv: tuple[int, int] | None = None
) -> int | None:
    """KV cache bytes per token from the config alone; None where that takes mlx-lm's model.
    `kv`: (bits, group size) of mlx-lm's quantized KV cache."""
    text = config.get("text_config") or config
    layout = KV_LAYOUT.get(text.get("model_type", config.get("model_type")))
    layers = text.get("num_hidden_layers")
    if layout is None or not isinstance(layers, int):
        return None
    # the sizes are checked (config.check_sizes) where given; one missing: mlx-lm's model decides
    if layout == "mla":
        rank, rope = text.get("kv_lora_rank"), text.get("qk_rope_head_dim")
        if rank is None or rope is None:
            return None
        width = rank + rope
    else:
        heads, hidden = text.get("num_attention_heads"), text.get("hidden_size")
        if heads is None or (text.get("head_dim") is None and hidden is None):
            return None
        head_dim = text.get("head_dim") or hidden // heads
        width = 2 * text.get("num_key_value_heads", heads) * head_dim
    return layers * quantized_width(width, dtype_bytes, kv)


def quantized_width(elements: int, dtype_bytes: int, kv: tuple[int, int] | None) -> int:
    """Bytes of `elements` cached values: as they are, or as mlx-lm's QuantizedKVCache holds
    them (`kv`: bits and group size): packed bits, and a scale and a bias per group."""
    if kv is None:
        return elements * dtype_bytes
    bits, group = kv
    return elements * bits // 8 + 2 * (elements // group) * dtype_bytes


def stored_bytes(folder: Path, manifest: Manifest) -> tuple[int, int]:
    """What repacked `folder` holds on disk: its resident file's bytes and the bytes of the expert
    files its manifest lists (one missing is refused, not counted as none)."""
    files = dict.fromkeys(layer.file for layer in manifest.layers)
    experts = sum(file_size(folder / name, "an expert file") for name in files)
    return file_size(folder / RESIDENT_FILE, "the non-expert weights"), experts


def repacked_plan(
    folder: Path, memory: int, dtype: mx.Dtype | None, kv: tuple[int, int] | None = None
) -> ModelPlan | None:
    """The plan of repacked `folder` from its files; None where mlx-lm's model is needed (a
    family not in KV_LAYOUT, a shard of an expert-parallel split)."""
    manifest = read_manifest(folder)
    config = check_sizes(manifest.config, folder / MANIFEST_FILE)  # no model is built to check it
    check_repacked_config_json(folder, manifest)
    dtype_bytes = dtype.size if dtype is not None else DTYPE_BYTES.get(config.get("torch_dtype"), 2)
    per_token = kv_bytes_per_token(config, dtype_bytes, kv)
    if per_token is None or manifest.shard is not None or not manifest.layers:
        return None
    stored_resident, expert_bytes = stored_bytes(folder, manifest)
    resident = stored_resident
    if dtype is not None:  # floating tensors in the compute dtype, the rest as stored
        resident = sum(
            math.prod(t.shape) * dtype.size if _floating(t.dtype) else t.nbytes
            for t in read_header(folder / RESIDENT_FILE).values()
        )
    top_k = experts_per_token(config)
    return fitted(
        model_type=config["model_type"],
        moe_layers=len(manifest.layers),
        experts=manifest.layers[0].num_experts,
        experts_per_token=top_k,
        disk_bytes=stored_resident + expert_bytes,
        delete_source_peak_bytes=None,
        download_bytes=None,
        resident_bytes=resident,
        expert_bytes=expert_bytes,
        expert_bytes_per_token=sum(layer.record_bytes for layer in manifest.layers) * top_k,
        kv_per_token=per_token,
        kv_fixed=0,
        context=context_length(config),
        memory=memory,
        kv_bits=kv and kv[0],
        shapes=manifest_shapes(folder, manifest, dtype),
    )


def manifest_shapes(folder: Path, manifest: Manifest, dtype: mx.Dtype | None) -> list[LayerShape]:
    """The MoE layers as a load of `folder` gives them to its residency plan."""
    layouts = [repacked_layout(folder, i, layer) for i, layer in enumerate(manifest.layers)]
    return layer_shapes(manifest.layers, layouts, dtype)


def _floating(dtype: str) -> bool:
    return mx.issubdtype(DTYPES[dtype][1], mx.floating)
