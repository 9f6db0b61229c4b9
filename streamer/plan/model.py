"""The plan from mlx-lm's own model for a config, built with lazy (never computed) weights.

Parameter shapes give the resident and expert bytes (quantized as config.json's `quantization` or
`--quantize` says, each expert record laid out as the repacker lays it out), and the KV cache
bytes per token are those of mlx-lm's caches after a lazy forward pass at two lengths (so sliding
windows, MLA's compressed cache and linear-attention state count as they are). With a download
present, repack's own recipe for it (made once) gives the shapes and dtypes from its safetensors
headers, and `repack.recipe_disk_needs` of that recipe the disk peak with --delete-source (a
record sized from the headers too). No weights are read; each shard's header is parsed once.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import StreamerError, one_line
from ..families.architectures import (
    build_model,
    expert_container_of,
    expert_containers,
)
from ..families.config import check_config, context_length, experts_per_token
from ..families.expert_lists import STACKED_MODELS
from ..families.mlx_lm_models import models_without_package_init
from ..families.model_types import mlx_lm_model_type
from ..families.transformers.spellings import normalize_config
from ..families.unread_quantization import refuse_left_to_sanitize, refuse_unread_quantization
from ..io.json_file import read_json_object
from ..io.manifest import MANIFEST_FILE, RECORD_ALIGN, TENSOR_ALIGN, read_manifest
from ..io.mapping import align
from ..io.safetensors import DTYPES as SAFETENSORS_DTYPES
from ..loading.backend import check_model_kernels
from ..loading.hub import needs_repack
from ..loading.residency import LayerShape
from .config_quantization import quantize_as_config
from .repacked import manifest_shapes, stored_bytes
from .report import ModelPlan, fitted

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
# two cache lengths, multiples of mlx-lm's KVCache step (256): its growth between them is per token
KV_LENGTHS = (256, 512)


def model_plan(
    source: Path,
    memory: int,
    quantize: tuple | None,
    dtype: mx.Dtype | None,
    kv: tuple[int, int] | None = None,
) -> ModelPlan:
    folder = source if source.is_dir() else source.parent
    config_path = source / "config.json" if source.is_dir() else source  # a FIFO too: refused
    repacked = (folder / MANIFEST_FILE).exists()
    peak = download = records = None
    if source.is_dir() and not repacked and any(folder.glob("*.safetensors")):
        # exactly as repack will write it
        model, config, peak, download, records = _download_model(folder, quantize)
    else:
        model, config = _config_model(config_path, repacked, quantize)
    check_model_kernels(model)  # its KV caches are measured by a (lazy) forward pass
    containers = expert_containers(model)
    records = records or [_record_bytes(c) for c in containers.values()]
    expert_bytes = sum(r * _num_experts(c) for r, c in zip(records, containers.values()))
    stored_resident = _resident(model, containers, None)
    resident = _resident(model, containers, dtype)
    shapes = [_shape(i, c, dtype) for i, c in enumerate(containers.values())]
    if repacked:  # the files as written
        stored_resident, expert_bytes = stored_bytes(folder, manifest := read_manifest(folder))
        resident = stored_resident if dtype is None else resident
        shapes = manifest_shapes(folder, manifest, dtype)  # as its load plans them
    compute = dtype or DTYPES.get(config.get("torch_dtype"), mx.bfloat16)
    per_token, fixed = _kv_bytes(model, compute, kv)
    top_k = experts_per_token(config)
    return fitted(
        model_type=config["model_type"],
        moe_layers=len(containers),
        experts=_num_experts(next(iter(containers.values()))),
        experts_per_token=top_k,
        disk_bytes=stored_resident + expert_bytes,
        delete_source_peak_bytes=peak,
        download_bytes=download,
        in_place_ranges=peak and _in_place_ranges(folder, config, containers, quantize),
        resident_bytes=resident,
        expert_bytes=expert_bytes,
        expert_bytes_per_token=sum(records) * top_k,
        kv_per_token=per_token,
        kv_fixed=fixed,
        context=context_length(config),
        memory=memory,
        kv_bits=kv and kv[0],
        shapes=shapes,
    )


def _download_model(
    folder: Path, quantize: tuple | None
) -> tuple[nn.Module, dict, int, int, list[int]]:
    """repack's own recipe for a download (made once: it builds and sanitizes the whole model):
    resident weights as the checkpoint holds them (lazily, never read), experts in their target
    shapes, quantized as repack will; the disk peak with --delete-source; the bytes of the
    checkpoint's tensors, from the headers parsed once; and each layer's record as repack writes
    it, its tensors in the dtypes it writes (the source's, which config.json's torch_dtype may
    not say: a float32 expert under torch_dtype bfloat16 is twice the size). The download is the
    shards repack reads (and --delete-source deletes): the index's, else `model*.safetensors`;
    another *.safetensors beside them (a `consolidated.safetensors` of the same weights) is not
    counted, as the model does not need it."""
    from ..io.checkpoint import Checkpoint
    from ..repack import Quantize, recipe_disk_needs
    from ..repack.recipe import make_recipe
    from ..repack.records import expert_layouts

    with Checkpoint(folder) as checkpoint:
        recipe = make_recipe(checkpoint, Quantize(*quantize) if quantize else None)
        peak = recipe_disk_needs(recipe)[1]
        download = sum(info.nbytes for info in checkpoint.tensors.values())
        layouts = expert_layouts(recipe)
    for container, (tensors, _) in zip(recipe.containers.values(), layouts):
        written = {t.name: (t.dtype, t.shape) for t in tensors}
        container.update(tree_unflatten(_as_written(container, written)))
    return recipe.model, recipe.config, peak, download, [size for _, size in layouts]


def _as_written(container: nn.Module, written: dict[str, tuple]) -> list[tuple[str, mx.array]]:
    """The container's expert tensors (lazy, never evaluated) in the dtypes repack writes them."""
    arrays = []
    for name, array in tree_flatten(container.parameters()):
        dtype, shape = written.get(name, (None, None))
        if dtype is not None and shape == tuple(array.shape[1:]):
            arrays.append((name, array.astype(SAFETENSORS_DTYPES[dtype][1])))
    return arrays


def _config_model(path: Path, repacked: bool, quantize: tuple | None) -> tuple[nn.Module, dict]:
    """mlx-lm's model for a config.json alone, in its dtype, quantized as it says (or as
    `quantize`)."""
    published = read_manifest(path.parent).config if repacked else _read_config(path)
    config = normalize_config(check_config(published, path))
    if not repacked:
        refuse_unread_quantization(config, path)  # as repack would
    model = build_model(config, path)
    if not repacked:
        refuse_left_to_sanitize(model, published, path)
    model.set_dtype(DTYPES.get(config.get("torch_dtype"), mx.bfloat16))
    quantize_as_config(model, config, published, quantize)
    return model, config


def _read_config(path: Path) -> dict:
    return read_json_object(
        path,
        "plan needs a model's config.json.",
        missing="plan needs a model's config.json (e.g. `hf download ORG/NAME config.json`), its "
        "folder, or a repacked folder.",
    )


def _num_experts(container: nn.Module) -> int:
    return next(a.shape[0] for _, a in tree_flatten(container.parameters()))


def _shape(index: int, container: nn.Module, dtype: mx.Dtype | None) -> LayerShape:
    """A layer as a load's residency plan sees it (loading/residency.layer_shapes): an expert's
    tensors as stored, and in memory in the compute dtype (not its padded record)."""
    tensors = tree_flatten(container.parameters())
    return LayerShape(
        index=index,
        tensors=tuple((name, a.dtype, tuple(a.shape[1:])) for name, a in tensors),
        experts=_num_experts(container),
        slot_bytes=sum(a.nbytes // a.shape[0] for _, a in tensors),
        resident_bytes=sum(_in_dtype(a, dtype) for _, a in tensors) // _num_experts(container),
    )


def _record_bytes(container: nn.Module) -> int:
    """One expert's record as repack lays it out: tensors TENSOR_ALIGN apart, page-rounded."""
    offset = 0
    for _, array in tree_flatten(container.parameters()):
        offset = align(offset + array.nbytes // array.shape[0], TENSOR_ALIGN)
    return align(max(offset, 1), RECORD_ALIGN)


def _resident(model: nn.Module, containers: dict, dtype: mx.Dtype | None) -> int:
    arrays = tree_flatten(model.parameters())
    return sum(_in_dtype(a, dtype) for n, a in arrays if not expert_container_of(n, containers))


def _in_dtype(array: mx.array, dtype: mx.Dtype | None) -> int:
    """An array's bytes with its floating values in `dtype` (None: as they are)."""
    floating = dtype is not None and mx.issubdtype(array.dtype, mx.floating)
    return array.size * dtype.size if floating else array.nbytes


def _kv_bytes(
    model: nn.Module, dtype: mx.Dtype, kv: tuple[int, int] | None = None
) -> tuple[int, int]:
    """(bytes per token, fixed bytes) of mlx-lm's caches, measured after a lazy prompt and one
    decode step (a sliding window is trimmed on the step after the prompt) at two lengths; with
    `kv` (bits, group size), once mlx-lm's generate_step has quantized them (from the start)."""
    with models_without_package_init():
        from mlx_lm.models.cache import make_prompt_cache

    model.set_dtype(dtype)
    sizes = []
    for length in KV_LENGTHS:
        cache = make_prompt_cache(model)
        model(mx.zeros((1, length - 1), dtype=mx.int32), cache=cache)
        model(mx.zeros((1, 1), dtype=mx.int32), cache=cache)
        if kv is not None:
            _quantized(cache, kv)
        sizes.append(sum(c.nbytes for c in cache))
    per_token = (sizes[1] - sizes[0]) // (KV_LENGTHS[1] - KV_LENGTHS[0])
    return per_token, max(0, sizes[0] - per_token * KV_LENGTHS[0])


def _quantized(cache: list, kv: tuple[int, int]) -> None:
    # mlx_lm.generate imports mlx_lm.utils and so transformers (seconds): only with --kv-bits
    from mlx_lm.generate import maybe_quantize_kv_cache

    try:
        maybe_quantize_kv_cache(cache, 0, kv[1], kv[0])
    except NotImplementedError:
        raise StreamerError(
            "--kv-bits: mlx-lm cannot quantize this model's sliding-window (rotating) KV cache."
        ) from None
    except ValueError as e:
        raise StreamerError(
            f"--kv-group-size {kv[1]} does not divide this model's key and value widths "
            f"({one_line(e)}): choose a smaller one."
        ) from None


def _in_place_ranges(folder: Path, config: dict, containers: dict, quantize) -> int | None:
    """Byte ranges per expert in a download's shards when a load streams it in place: MLX-quantized
    as its own config.json says (`config` calls gpt-oss's MXFP4 quantized too: it is repacked), not
    planned with --quantize, and not a family mlx_lm.convert leaves unstacked (STACKED_MODELS): one
    per tensor of its record; else None."""
    if quantize or needs_repack(folder) or mlx_lm_model_type(config) in STACKED_MODELS:
        return None
    return len(tree_flatten(next(iter(containers.values())).parameters()))
