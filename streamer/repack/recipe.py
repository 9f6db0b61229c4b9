"""What a repack will write: the model mlx-lm builds from config.json, with the resident weights
checked and loaded (and quantized with --quantize), and the sources of every expert tensor."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

from ..errors import StreamerError
from ..families.architectures import (
    build_model,
    container_projections,
    expert_container_of,
    expert_containers,
    quantize_like_mlx_lm,
    quantize_like_mlx_lm_convert,
)
from ..families.config import check_config, check_layer_count
from ..families.config.common_fields import MODE_DEFAULTS, mlx_refuses
from ..families.hf_naming import Architecture, hf_expert_key
from ..families.model_types import architecture
from ..families.tied_embeddings import untied_where_saved, with_tied_lm_head
from ..families.transformers.left_out import left_out_hint
from ..families.transformers.spellings import normalize_config
from ..families.unread_quantization import (
    refuse_fp8_misread,
    refuse_per_tensor_scales,
    refuse_unread_quantization,
)
from ..io.checkpoint import Checkpoint
from ..io.safetensors import MLX_TO_SAFETENSORS
from .dtypes import compatible, describe
from .layouts import refuse_in_memory_layout, sanitizer
from .sources import Sources

CONVERSION_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


# MLX's quantization modes: (bits, group size) each allows; affine takes any of its bits
MODES = {m: None if m == "affine" else (bits, group) for m, (group, bits) in MODE_DEFAULTS.items()}


@dataclass
class Quantize:
    """`--quantize`: as `mlx_lm.convert --quantize --q-bits --q-group-size --q-mode`."""

    bits: int
    group_size: int = 64
    mode: str = "affine"

    def __post_init__(self):
        fixed = MODES.get(self.mode, ())
        if fixed == ():
            raise StreamerError(f"--q-mode must be one of {', '.join(MODES)}, not {self.mode!r}.")
        if fixed is not None and (self.bits, self.group_size) != fixed:
            raise StreamerError(
                f"--q-mode {self.mode} quantizes to {fixed[0]} bits in groups of {fixed[1]}: "
                f"pass --quantize {fixed[0]} (and no other --group-size)."
            )
        refused = mlx_refuses(self.group_size, self.bits, self.mode)
        if refused:  # else MLX's ValueError once the model is built (affine --group-size 16)
            raise StreamerError(
                f"--quantize {self.bits} --group-size {self.group_size} --q-mode {self.mode}: "
                f"MLX does not quantize so ({refused}); choose another --group-size."
            )


@dataclass
class Recipe:
    folder: Path  # the source checkpoint
    model: nn.Module  # resident weights loaded; expert containers hold the target shapes
    config: dict  # the repacked model's config.json
    containers: dict[str, nn.Module]  # module path -> expert container, in layer order
    num_experts: int
    sources: Sources
    quantize: Quantize | None
    cast: mx.Dtype | None  # float dtype of quantized experts before quantizing (as mlx_lm.convert)
    prequantized: set[str]  # `module.proj` the checkpoint holds quantized: copied as they are

    def resident_items(self) -> list[tuple[str, mx.array]]:
        return [
            (name, arr)
            for name, arr in tree_flatten(self.model.parameters())
            if not in_containers(name, self.containers)
        ]


def in_containers(name: str, containers: dict[str, nn.Module]) -> bool:
    return expert_container_of(name, containers) is not None


def make_recipe(ckpt: Checkpoint, quantize: Quantize | None) -> Recipe:
    """Check the checkpoint against its config.json and make its repack's recipe; refuse what
    cannot be."""
    where = ckpt.folder / "config.json"
    config = untied_where_saved(normalize_config(check_config(ckpt.config, where)), ckpt.tensors)
    check_layer_count(config, ckpt.tensors, where)
    arch = architecture(config, where)
    refuse_unread_quantization(config, where)
    # MLX-quantized checkpoints are refused; a published MXFP4 gpt-oss is not (its MXFP4 experts
    # are kept and the other weights quantized, as `mlx_lm.convert --quantize` does)
    if quantize and "quantization" in ckpt.config:
        raise StreamerError(
            f"{where}: the checkpoint is already quantized; repack it without --quantize."
        )
    model = build_model(config, where)
    refuse_per_tensor_scales(model, ckpt, where)  # before its sanitize fails on them
    containers = expert_containers(model)
    first = next(iter(containers.values()))
    num_experts = first[container_projections(first)[0]].num_experts
    sanitize = sanitizer(model, ckpt.folder, config)
    # mlx-lm's own sanitize maps every source name to mlx-lm's names (and drops what the model
    # does not use); it runs on lazy arrays, so expert tensors it stacks or splits are never read.
    weights = sanitize({name: ckpt.lazy(name) for name in ckpt.tensors})
    weights = with_tied_lm_head(model, config, weights)
    refuse_fp8_misread(ckpt, config, weights, where)
    check_zero_points(config, containers, weights, where)
    sources = Sources(ckpt, arch, containers, num_experts, sanitize, weights)
    resident = {
        n: a
        for n, a in weights.items()
        if not in_containers(n, containers)
        and not unstacked_expert(n, arch, containers, num_experts)
    }
    quantize_like_mlx_lm(model, config, weights)
    check_expert_kinds(sources, containers)
    prequantized = {name.rsplit(".", 1)[0] for name in weights if name.endswith(".scales")}
    refuse_in_memory_layout(resident, ckpt.folder, config["model_type"])
    check_resident(model, containers, resident, ckpt)
    model.load_weights(list(resident.items()), strict=False)
    cast = None
    if quantize:
        cast = CONVERSION_DTYPES.get(config.get("torch_dtype"))
        config = quantize_resident(model, config, quantize, cast)
    return Recipe(
        ckpt.folder, model, config, containers, num_experts, sources, quantize, cast, prequantized
    )


def unstacked_expert(
    name: str, arch: Architecture, containers: dict[str, nn.Module], num_experts: int
) -> bool:
    """A per-expert tensor that sanitize renamed but left unstacked: mlx-lm's qwen3_5_moe reads its
    experts fused only, and transformers 5 saves them one per expert. Sources reads them as it
    reads any per-expert tensor, so they are not resident weights (an expert past config.json's
    count stays one, and is refused as not part of the model)."""
    match = hf_expert_key(arch).match(name)
    return (
        match is not None
        and int(match["expert"]) < num_experts
        and match["proj"] in arch.hf_projections
        and any(match["parent"] == arch.hf_parent(c) for c in containers)
    )


def check_zero_points(
    config: dict, containers: dict[str, nn.Module], weights: dict[str, mx.array], where: Path
) -> None:
    """Affine-quantized experts need their zero points (`biases`): a model whose sanitize makes none
    from a packed format (kimi_k3's of compressed-tensors' int4 `pack-quantized`) is one mlx-lm
    cannot load either. A layer's mode is its own entry's in config.json, else the one its scales
    show (as mlx-lm infers it: affine keeps them in a float dtype)."""
    quantization = config.get("quantization", {})
    if quantization.get("mode", "affine") != "affine":
        return
    for name in weights:
        module = name.removesuffix(".scales")
        if module == name or not in_containers(name, containers) or f"{module}.biases" in weights:
            continue
        entry = quantization.get(module)
        if isinstance(entry, dict) and entry.get("mode", "affine") != "affine":
            continue
        if not isinstance(entry, dict) and weights[name].dtype == mx.uint8:  # MX/NV-FP scales
            continue
        raise StreamerError(
            f"{where}: mlx-lm's {config['model_type']} sanitize gives these packed experts "
            f"no zero points ('{module}.biases'), so mlx-lm cannot load this checkpoint "
            "either; repack a bf16, MXFP4 or MLX-quantized version."
        )


def check_resident(
    model: nn.Module,
    containers: dict[str, nn.Module],
    resident: dict[str, mx.array],
    ckpt: Checkpoint,
) -> None:
    """The checkpoint's non-expert tensors are exactly the model's, in its shapes and dtypes."""
    expected = {
        name: arr
        for name, arr in tree_flatten(model.parameters())
        if not in_containers(name, containers)
    }
    where = ckpt.folder
    missing = sorted(set(expected) - set(resident))
    if missing:
        raise StreamerError(
            f"{where}: the checkpoint lacks {len(missing)} non-expert tensor(s), e.g. "
            f"'{missing[0]}': the download is incomplete or config.json belongs to another "
            f"model.{left_out_hint(ckpt.config)}"
        )
    unexpected = sorted(set(resident) - set(expected))
    if unexpected:
        raise StreamerError(
            f"{where}: tensor '{unexpected[0]}' (and {len(unexpected) - 1} more) is not part of a "
            f"{ckpt.config.get('model_type')} model with this config.json."
            + left_out_hint(ckpt.config)
        )
    for name, arr in resident.items():
        if tuple(arr.shape) != tuple(expected[name].shape):
            raise StreamerError(
                f"{where}: tensor '{name}' has shape {tuple(arr.shape)} but config.json implies "
                f"{tuple(expected[name].shape)}.{left_out_hint(ckpt.config)}"
            )
        if not compatible(arr.dtype, expected[name].dtype):
            raise StreamerError(
                f"{where}: tensor '{name}' is {MLX_TO_SAFETENSORS.get(arr.dtype, arr.dtype)} but "
                f"config.json implies {describe(expected[name].dtype)}: the checkpoint is corrupt "
                "or config.json belongs to another model."
            )


def check_expert_kinds(sources: Sources, containers: dict[str, nn.Module]) -> None:
    """Expert tensors of a kind the model's experts lack (a `bias` where config.json gives them
    none) are refused as resident tensors the model lacks are: they were dropped silently."""
    ckpt = sources.ckpt
    first = {key: per[min(per)] for key, per in sources.per_expert.items()}
    for (module, proj, kind), info in {**sources.stacked, **first}.items():
        target = containers[module].get(proj) or {}
        converted = module in sources.fused or proj in sources.converted.get(module, {})
        if not converted and target.get(kind) is None:  # sanitize converts converted kinds
            raise StreamerError(
                f"{ckpt.folder}: tensor '{info.name}' is not part of a "
                f"{ckpt.config.get('model_type')} model with this config.json."
                + left_out_hint(ckpt.config)
            )


def quantize_resident(
    model: nn.Module, config: dict, quantize: Quantize, cast: mx.Dtype | None
) -> dict:
    """Quantize resident weights as `mlx_lm.convert --quantize` does (experts follow in
    records.expert_parts); return the quantized model's config."""
    if cast is not None:
        keep = getattr(model, "cast_predicate", lambda _: True)
        model.update(
            tree_map_with_path(
                lambda k, v: (
                    v.astype(cast) if keep(k) and mx.issubdtype(v.dtype, mx.floating) else v
                ),
                model.parameters(),
            )
        )
    return quantize_like_mlx_lm_convert(
        model, config, quantize.group_size, quantize.bits, quantize.mode
    )
