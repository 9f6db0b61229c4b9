"""Expert layouts that checkpoints use and mlx-lm's sanitize does not read, converted into names
it does read; `sanitizer` runs the conversion before the model's own sanitize. Each conversion
keeps the expert axis first, so it also runs on one expert's slice.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError
from ..families.tied_embeddings import ties


def gpt_oss_from_transformers(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """gpt-oss as transformers writes it unquantized (the BF16 re-uploads; `GptOssExperts` in
    transformers' modeling_gpt_oss): per layer `experts.gate_up_proj` [E, H, 2I] with gate and up
    interleaved on the last axis (gate the even columns), `gate_up_proj_bias` [E, 2I] alike,
    `down_proj` [E, I, H], `down_proj_bias` [E, H], applied as `x @ W + b`. mlx-lm's SwitchGLU
    holds [E, out, in] weights under `experts.{gate,up,down}_proj`. The MXFP4 download
    (`*_blocks`, `*_scales`) is left to mlx-lm's sanitize."""
    out = {}
    for name, value in weights.items():
        base, _, leaf = name.rpartition(".experts.")
        if not base or leaf not in (
            "gate_up_proj",
            "gate_up_proj_bias",
            "down_proj",
            "down_proj_bias",
        ):
            out[name] = value
            continue
        experts = f"{base}.experts"
        if leaf == "gate_up_proj":
            out[f"{experts}.gate_proj.weight"] = mx.swapaxes(value[..., 0::2], -1, -2)
            out[f"{experts}.up_proj.weight"] = mx.swapaxes(value[..., 1::2], -1, -2)
        elif leaf == "gate_up_proj_bias":
            out[f"{experts}.gate_proj.bias"] = value[..., 0::2]
            out[f"{experts}.up_proj.bias"] = value[..., 1::2]
        elif leaf == "down_proj":
            out[f"{experts}.down_proj.weight"] = mx.swapaxes(value, -1, -2)
        else:
            out[f"{experts}.down_proj.bias"] = value
    return out


def inputs_first_from_transformers_5(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Qwen3-VL-MoE as transformers 5 writes it: `experts.gate_up_proj` [E, 2I, H] and
    `experts.down_proj` [E, H, I] (outputs first), where the published checkpoints, which mlx-lm's
    sanitize reads, hold [E, H, 2I] and [E, I, H]. The two tensors' shapes tell the layouts apart
    whatever the sizes: outputs first, gate_up's inputs (H) are down's outputs."""
    out = dict(weights)
    for name, gate_up in weights.items():
        if not name.endswith(".experts.gate_up_proj"):
            continue
        down_name = name.removesuffix("gate_up_proj") + "down_proj"
        down = weights.get(down_name)
        if down is None or gate_up.ndim != 3 or down.ndim != 3:
            continue
        if gate_up.shape[-1] == down.shape[-2] and gate_up.shape[-2] != down.shape[-1]:
            out[name] = mx.swapaxes(gate_up, -1, -2)
            out[down_name] = mx.swapaxes(down, -1, -2)
    return out


def kimi_linear_dense_from_transformers_5(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Kimi Linear's dense layers as transformers 5 writes them, under `block_sparse_moe`
    (`...block_sparse_moe.gate_proj.weight`); mlx-lm's model holds them under `mlp`. A MoE
    layer's own tensors there are `gate`, `experts.*` and `shared_experts.*`, never these."""
    out = {}
    for name, value in weights.items():
        for proj in ("gate_proj", "up_proj", "down_proj"):
            name = name.replace(f".block_sparse_moe.{proj}.", f".mlp.{proj}.")
        out[name] = value
    return out


def zero_experts_from_transformers(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """LongCat-Flash as transformers writes it: its `LongcatFlashExperts.gate_up_proj` has a row
    block for every expert, the zero (identity) experts too, which it never computes with, and
    `down_proj` one for the routed experts only, so `save_pretrained` writes
    `experts.{e}.gate_proj` / `up_proj` with no `down_proj` for each zero expert. mlx-lm's model
    has no tensors for them (nor does the hub's checkpoint): dropped."""
    experts = {name: _PER_EXPERT.match(name) for name in weights}
    routed = {m["expert"] for m in experts.values() if m and m["proj"] == "down_proj"}
    return {
        name: value
        for name, value in weights.items()
        if experts[name] is None or experts[name]["expert"] in routed
    }


_PER_EXPERT = re.compile(r"^(?P<expert>.+\.experts\.\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.")


def bailing_v3_from_transformers_5(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Ling 3 as transformers 5 writes it: every attention's output projection as
    `attention.dense` (its save renames its o_proj back to the published MLA name, for the KDA
    layers too, which the published checkpoints and mlx-lm name `attention.o_proj`). A KDA
    layer is told by its forget gate's `attention.A_log`."""
    out = dict(weights)
    for name in weights:
        if name.endswith(".attention.A_log"):
            attention = name.removesuffix("A_log")
            dense, o_proj = attention + "dense.weight", attention + "o_proj.weight"
            if dense in out and o_proj not in out:
                out[o_proj] = out.pop(dense)
    return out


def kimi_k25_from_transformers_5(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Kimi K2.5 as transformers 5.24 writes it: the renames its loader makes to the vision
    tower's published names (`blocks` -> `layers`, `wqkv` -> `attn.{q,k,v}_proj` permuted for
    the vision RoPE) run backwards over the whole model on save, so the text model's layers come
    out as `language_model.model.blocks.{l}`, and the projector's norm stays
    `model.mm_projector.pre_norm`; the published checkpoints, and mlx-lm, name them
    `language_model.model.layers.{l}` and `mm_projector.pre_norm` (dropped with the vision
    tower). A text model without q LoRA has its `self_attn.q_proj` written as `self_wqkv`, its
    rows permuted by the vision tower's head count, which the weights do not hold: refused."""
    out = {}
    for name, value in weights.items():
        if name.endswith(".self_wqkv.weight"):
            raise StreamerError(
                f"tensor {name!r}: Kimi K2.5's text q_proj as transformers 5.24's save_pretrained"
                " writes it without q LoRA, under the vision tower's fused name with its rows"
                " permuted for the vision heads (transformers cannot load it back either);"
                " repack the published checkpoint instead."
            )
        for theirs, ours in _KIMI_K25_NAMES:
            if name.startswith(theirs):
                name = ours + name[len(theirs) :]
        out[name] = value
    return out


_KIMI_K25_NAMES = (
    ("language_model.model.blocks.", "language_model.model.layers."),
    ("model.mm_projector.", "mm_projector."),
)


def text_alone_from_transformers(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Llama 4's text model as transformers saves it alone (`Llama4ForCausalLM`: `model.*`,
    `lm_head.*`), which mlx-lm's llama4 reads under `language_model.` as published."""
    if any(name.startswith("language_model.") for name in weights):
        return weights
    return {
        f"language_model.{name}" if name.startswith(("model.", "lm_head.")) else name: value
        for name, value in weights.items()
    }


# mlx-lm model file -> the conversion run before its sanitize
LAYOUTS: dict[str, Callable[[dict[str, mx.array]], dict[str, mx.array]]] = {
    "gpt_oss": gpt_oss_from_transformers,
    "qwen3_vl_moe": inputs_first_from_transformers_5,
    "kimi_linear": kimi_linear_dense_from_transformers_5,
    "longcat_flash": zero_experts_from_transformers,
    "bailing_moe_v3": bailing_v3_from_transformers_5,
    "kimi_k25": kimi_k25_from_transformers_5,
    "llama4": text_alone_from_transformers,
}


# mlx-lm model file -> (embeddings, output projection) of a model that mlx-lm always gives an
# output projection of its own, where transformers ties the two (config.json's
# tie_word_embeddings; its save then writes the embeddings only): the output is the embeddings.
# Kimi K2.5's config in transformers ties them by default.
TIED_OUTPUTS = {
    "kimi_k25": ("language_model.model.embed_tokens.weight", "language_model.lm_head.weight"),
    # Qwen3-VL-MoE's sanitize reads the top-level lm_head, which its text model always has
    "qwen3_vl_moe": ("model.language_model.embed_tokens.weight", "lm_head.weight"),
}

Sanitize = Callable[[dict[str, mx.array]], dict[str, mx.array]]


def sanitizer(model: nn.Module, folder: Path, config: dict | None = None) -> Sanitize:
    """mlx-lm's own sanitize (source names -> mlx-lm's names), after the conversion of a layout it
    does not read (`layouts.LAYOUTS`) and, where `config` ties them, the output projection taken
    from the embeddings (`TIED_OUTPUTS`); a missing tensor: a clear error."""
    family = type(model).__module__.rsplit(".", 1)[1]
    layout = LAYOUTS.get(family, lambda weights: weights)
    tied = TIED_OUTPUTS.get(family) if ties(config or {}) else None

    def convert(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        weights = layout(weights)
        if tied and tied[0] in weights and tied[1] not in weights:
            weights = {**weights, tied[1]: weights[tied[0]]}
        return weights

    if not hasattr(model, "sanitize"):
        return convert

    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        # sanitize pops
        shapes = {name: (tuple(array.shape), array.dtype) for name, array in weights.items()}
        try:
            return model.sanitize(convert(weights))
        except KeyError as e:
            raise StreamerError(
                f"{folder}: tensor {e.args[0]!r} is missing: the download is incomplete."
            ) from None
        except ValueError as e:  # MLX's stack of per-expert tensors of unequal shapes or dtypes
            raise StreamerError(_unstackable(folder, shapes, e)) from None

    return sanitize


def _unstackable(folder: Path, shapes: dict[str, tuple], error: ValueError) -> str:
    """The expert tensor whose shape (else dtype) differs from its siblings' (the ones sanitize
    stacks or converts alike)."""
    groups: dict[str, dict[str, tuple]] = {}
    for name, shape in shapes.items():
        key = re.sub(r"\.experts\.\d+\.", ".experts.*.", name)
        groups.setdefault(key, {})[name] = shape
    for group in groups.values():
        common = max(set(group.values()), key=list(group.values()).count)
        odd = next((n for n, shape in group.items() if shape != common), None)
        if odd is not None:
            (shape, dtype), (common_shape, common_dtype) = group[odd], common
            differs = (
                f"has shape {shape} but the other experts' have {common_shape}"
                if shape != common_shape
                else f"is {_name(dtype)} but the other experts' are {_name(common_dtype)}"
            )
            return f"{folder}: tensor '{odd}' {differs}: the shard is damaged; download it again."
    return f"{folder}: mlx-lm cannot read these tensors ({error}); download the model again."


def _name(dtype: mx.Dtype) -> str:
    return str(dtype).rpartition(".")[2]  # mlx.core.bfloat16 -> bfloat16


def refuse_in_memory_layout(weights: dict[str, mx.array], where: Path, model_type: str) -> None:
    """transformers 5's in-memory experts (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj`
    [E, H, I]: what `save_pretrained(save_original_format=False)` writes, its other tensors
    under its in-memory names too) left in `weights` after sanitize: a layout that neither this
    family's published checkpoints nor mlx-lm's model use (where they do, sanitize or LAYOUTS
    has read them)."""
    for name, value in weights.items():
        if name.endswith((".experts.gate_up_proj", ".experts.down_proj")) and value.ndim == 3:
            raise StreamerError(
                f"{where}: tensor '{name}' is transformers 5's in-memory expert layout (what "
                "save_pretrained(save_original_format=False) writes), which neither the published "
                f"{model_type} checkpoints nor mlx-lm use: save the model again with "
                "save_original_format=True (the default)."
            )
