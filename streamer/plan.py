"""`streamer plan`: what a model needs before it is downloaded or repacked.

Everything comes from config.json and mlx-lm's own model for it, built with lazy (never computed)
weights: parameter shapes give the resident and expert bytes (quantized as config.json's
`quantization` or `--quantize` says, each expert record laid out as the repacker lays it out), and
the KV cache bytes per token are those of mlx-lm's caches after a lazy forward pass at two lengths
(so sliding windows, MLA's compressed cache and linear-attention state count as they are). A
repacked folder's own file sizes replace the estimates; with a download present, repack's own plan
of it gives the shapes and dtypes from its safetensors headers, and `repack.disk_needs` the disk
peak with --delete-source (which reads one expert's bytes to size a record). No other weights are
read.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .architectures import build_model, expert_containers, normalize_config
from .config import check_config
from .errors import StreamerError
from .io.json_file import read_json_object
from .io.manifest import MANIFEST_FILE, RECORD_ALIGN, RESIDENT_FILE, TENSOR_ALIGN
from .io.mapping import align

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
# two cache lengths, multiples of mlx-lm's KVCache step (256): its growth between them is per token
KV_LENGTHS = (256, 512)
MIN_CONTEXT = 4096  # "runs": the resident weights plus this much context fit


@dataclass
class ModelPlan:
    model_type: str
    moe_layers: int
    experts: int
    experts_per_token: int
    disk_bytes: int  # the repacked folder
    delete_source_peak_bytes: int | None  # repack --delete-source's peak beyond the download
    download_bytes: int | None  # safetensors in the source folder, when there
    resident_bytes: int  # non-expert weights, in memory, in the compute dtype
    expert_bytes: int  # streamed from disk
    expert_bytes_per_token: int  # read per token when no expert is cached
    kv_bytes_per_1k_tokens: int
    kv_fixed_bytes: int  # state that does not grow (linear attention, sliding windows)
    context_length: int | None  # max_position_embeddings
    memory_bytes: int
    longest_context: int  # tokens of KV cache that fit beside the resident weights
    runs: bool

    def lines(self) -> list[str]:
        gb = _size
        lines = [
            f"model_type         {self.model_type}",
            f"experts            {self.experts} per layer in {self.moe_layers} MoE layers, "
            f"{self.experts_per_token} routed per token",
        ]
        if self.download_bytes is not None:
            lines.append(f"download           {gb(self.download_bytes)} (safetensors)")
        lines += [
            f"repack disk        {gb(self.disk_bytes)}"
            + (
                f" ({gb(self.delete_source_peak_bytes)} at most with --delete-source)"
                if self.delete_source_peak_bytes is not None
                else ""
            ),
            f"resident           {gb(self.resident_bytes)} (non-expert weights, in memory)",
            f"experts            {gb(self.expert_bytes)} (streamed from disk)",
            f"read per token     {gb(self.expert_bytes_per_token)} of experts with no cache hits",
            f"KV cache           {gb(self.kv_bytes_per_1k_tokens)} per 1k tokens"
            + (f" (+ {gb(self.kv_fixed_bytes)} fixed)" if self.kv_fixed_bytes else ""),
            f"longest context    {self.longest_context} tokens in {gb(self.memory_bytes)}"
            + (f" (the model's limit is {self.context_length})" if self.context_length else ""),
            f"runs               {'yes' if self.runs else 'no'}: "
            + (
                f"{gb(self.resident_bytes)} resident + KV of {self.min_context} tokens "
                f"{'fit' if self.runs else 'do not fit'} in {gb(self.memory_bytes)}"
            ),
        ]
        return lines

    @property
    def min_context(self) -> int:
        return min(MIN_CONTEXT, self.context_length or MIN_CONTEXT)

    def json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def plan(
    source: Path,
    memory_bytes: int,
    *,
    quantize: tuple[int, int] | None = None,
    dtype: mx.Dtype | None = None,
) -> ModelPlan:
    """`source`: a config.json, a download's folder or a repacked folder. `quantize`: (bits,
    group size) of `repack --quantize`. `dtype`: the compute dtype (None: the checkpoint's)."""
    folder = source if source.is_dir() else source.parent
    config_path = source / "config.json" if source.is_dir() else source  # a FIFO too: refused
    repacked = (folder / MANIFEST_FILE).exists()
    if repacked and quantize:
        raise StreamerError(
            f"{folder} is repacked already: --quantize plans a repack of a download."
        )
    peak = None
    if source.is_dir() and not repacked and any(folder.glob("*.safetensors")):
        from .repack import Quantize, disk_needs

        model, config = _download_model(folder, quantize)  # exactly as repack will write it
        peak = disk_needs(folder, Quantize(*quantize) if quantize else None)[1]
    else:
        model, config = _config_model(config_path, repacked, quantize)
    containers = expert_containers(model)
    records = [_record_bytes(c) for c in containers.values()]
    experts = _num_experts(next(iter(containers.values())))
    top_k = int(config.get("num_experts_per_tok", 0))
    expert_bytes = sum(r * experts for r in records)
    stored_resident = _resident(model, containers, None)
    resident = _resident(model, containers, dtype)
    if repacked:  # the files as written
        stored_resident = (folder / RESIDENT_FILE).stat().st_size
        expert_bytes = sum(p.stat().st_size for p in (folder / "experts").glob("*.bin"))
        resident = stored_resident if dtype is None else resident
    per_token, fixed = _kv_bytes(model, dtype or DTYPES.get(config.get("torch_dtype"), mx.bfloat16))
    disk = stored_resident + expert_bytes
    context = config.get("max_position_embeddings")
    room = memory_bytes - resident - fixed
    longest = max(0, room // per_token) if per_token else (context or 0)
    if context:
        longest = min(longest, context)
    return ModelPlan(
        model_type=config["model_type"],
        moe_layers=len(containers),
        experts=experts,
        experts_per_token=top_k,
        disk_bytes=disk,
        delete_source_peak_bytes=peak,
        download_bytes=_download_bytes(folder) if not repacked else None,
        resident_bytes=resident,
        expert_bytes=expert_bytes,
        expert_bytes_per_token=sum(records) * top_k,
        kv_bytes_per_1k_tokens=per_token * 1000,
        kv_fixed_bytes=fixed,
        context_length=context,
        memory_bytes=memory_bytes,
        longest_context=int(longest),
        runs=resident + fixed + per_token * min(MIN_CONTEXT, context or MIN_CONTEXT)
        <= memory_bytes,
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def _download_model(folder: Path, quantize: tuple[int, int] | None) -> tuple[nn.Module, dict]:
    """repack's own plan of a download: resident weights as the checkpoint holds them (lazily,
    never read), experts in their target shapes, quantized as repack will."""
    from .io.checkpoint import Checkpoint
    from .repack.plan import Quantize, make_plan

    with Checkpoint(folder) as checkpoint:
        repack_plan = make_plan(checkpoint, Quantize(*quantize) if quantize else None)
    model, config = repack_plan.model, repack_plan.config
    stored = DTYPES.get(config.get("torch_dtype"), mx.bfloat16)
    for container in repack_plan.containers.values():  # unquantized records keep the source dtype
        container.set_dtype(repack_plan.cast or stored)
    return model, config


def _config_model(
    path: Path, repacked: bool, quantize: tuple[int, int] | None
) -> tuple[nn.Module, dict]:
    """mlx-lm's model for a config.json alone, in its dtype, quantized as it says (or as
    `quantize`)."""
    if repacked:
        from .io.manifest import read_manifest

        config = read_manifest(path.parent).config
    else:
        config = _read_config(path)
    config = normalize_config(check_config(config, path))
    model = build_model(config, path)
    model.set_dtype(DTYPES.get(config.get("torch_dtype"), mx.bfloat16))
    if quantize and "quantization" not in config:
        from mlx_lm.utils import quantize_model

        with contextlib.redirect_stdout(io.StringIO()):  # its bits-per-weight line
            quantize_model(model, config, quantize[1], quantize[0])
    elif "quantization" in config:
        _quantize_as_config(model, config["quantization"])
    return model, config


def _read_config(path: Path) -> dict:
    return read_json_object(
        path,
        "plan needs a model's config.json.",
        missing="plan needs a model's config.json (e.g. `hf download ORG/NAME config.json`), its "
        "folder, or a repacked folder.",
    )


def _quantize_as_config(model: nn.Module, quantization: dict) -> None:
    """As mlx-lm loads an MLX-quantized model: per-module entries win; every other layer that
    can be quantized is (mlx-lm asks the weights, which a plan does not read)."""

    def predicate(path: str, module: nn.Module):
        if path in quantization:
            return quantization[path]
        return hasattr(module, "to_quantized")

    nn.quantize(
        model,
        group_size=quantization["group_size"],
        bits=quantization["bits"],
        mode=quantization.get("mode", "affine"),
        class_predicate=predicate,
    )


def _num_experts(container: nn.Module) -> int:
    return next(a.shape[0] for _, a in tree_flatten(container.parameters()))


def _record_bytes(container: nn.Module) -> int:
    """One expert's record as repack lays it out: tensors TENSOR_ALIGN apart, page-rounded."""
    offset = 0
    for _, array in tree_flatten(container.parameters()):
        offset = align(offset + array.nbytes // array.shape[0], TENSOR_ALIGN)
    return align(max(offset, 1), RECORD_ALIGN)


def _resident(model: nn.Module, containers: dict, dtype: mx.Dtype | None) -> int:
    total = 0
    for name, array in tree_flatten(model.parameters()):
        if any(name.startswith(c + ".") for c in containers):
            continue
        if dtype is not None and mx.issubdtype(array.dtype, mx.floating):
            total += array.size * dtype.size
        else:
            total += array.nbytes
    return total


def _kv_bytes(model: nn.Module, dtype: mx.Dtype) -> tuple[int, int]:
    """(bytes per token, fixed bytes) of mlx-lm's caches, measured after a lazy prompt and one
    decode step (a sliding window is trimmed on the step after the prompt) at two lengths."""
    from mlx_lm.models.cache import make_prompt_cache

    model.set_dtype(dtype)
    sizes = []
    for length in KV_LENGTHS:
        cache = make_prompt_cache(model)
        model(mx.zeros((1, length - 1), dtype=mx.int32), cache=cache)
        model(mx.zeros((1, 1), dtype=mx.int32), cache=cache)
        sizes.append(sum(c.nbytes for c in cache))
    per_token = (sizes[1] - sizes[0]) // (KV_LENGTHS[1] - KV_LENGTHS[0])
    return per_token, max(0, sizes[0] - per_token * KV_LENGTHS[0])


def _download_bytes(folder: Path) -> int | None:
    from .io.safetensors import read_header

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    return sum(info.nbytes for f in files for info in read_header(f).values())
