"""The record writer: one MoE layer's experts -> `experts/NNN.bin`, one fixed-size record each
(see streamer/io/manifest/), quantized on the way with --quantize."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ..errors import StreamerError
from ..families.architectures import container_projections, quantization_of
from ..families.mlx_lm_models import models_without_package_init
from ..io.manifest import RECORD_ALIGN, TENSOR_ALIGN, ExpertTensor, MoeLayer
from ..io.mapping import align
from ..io.safetensors import (
    DTYPES,
    MLX_TO_SAFETENSORS,
    itemsize,
    nonfinite_count,
    read_header,
    to_mlx,
    write_safetensors,
)
from .recipe import Recipe
from .sources import KIND_ORDER

with models_without_package_init():
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

MAX_NONFINITE_WARNINGS = 20
# bytes of a resident tensor checked at once: its largest (a 2 GB embedding at Kimi K2's or
# Llama 4's size) read whole took about 2.5x its size beside the weights the repack holds
CHECK_CHUNK = 64 << 20

# (name, safetensors dtype, shape, bytes), or the byte count in place of the bytes where sized
Part = tuple[str, str, tuple[int, ...], bytes | int]


class NonfiniteWarnings:
    """NaN/Inf weights make plausible-looking garbage downstream: say which tensor, once each."""

    def __init__(self, log):
        self.log, self.count = log, 0

    def check(self, where: str, dtype: str, data) -> None:
        self.report(where, nonfinite_count(data, dtype))

    def report(self, where: str, found: int) -> None:
        if found:
            self.count += 1
            if self.count <= MAX_NONFINITE_WARNINGS:
                self.log(f"[repack] warning: {where} holds {found} NaN/Inf value(s).")

    def check_file(self, path: Path) -> None:
        with open(path, "rb") as f:
            for name, info in read_header(path).items():
                f.seek(info.start)
                chunk = CHECK_CHUNK - CHECK_CHUNK % itemsize(info.dtype)  # whole values each
                found = sum(
                    nonfinite_count(f.read(min(chunk, info.nbytes - at)), info.dtype)
                    for at in range(0, info.nbytes, chunk)
                )
                self.report(f"resident tensor '{name}'", found)

    def summary(self) -> None:
        if self.count:
            self.log(
                f"[repack] warning: {self.count} tensor(s) hold NaN/Inf values (listed above, up "
                f"to {MAX_NONFINITE_WARNINGS}); this checkpoint will produce garbage. Check or "
                "download it again."
            )


def layer_bytes(recipe: Recipe) -> list[int]:
    """The size of each MoE layer's expert file. Layers differ where config.json sizes them each
    (Hunyuan's lists) or a mixed-bit recipe quantized them each."""
    return [size * recipe.num_experts for _, size in expert_layouts(recipe)]


def expert_layouts(recipe: Recipe) -> list[tuple[tuple[ExpertTensor, ...], int]]:
    """Each MoE layer's expert record as repack writes it (its tensors, their dtypes, its size),
    from the tensor headers and --quantize: no tensor's data is read."""
    return [
        layout(expert_parts(recipe, module, container, 0, read=False))
        for module, container in recipe.containers.items()
    ]


def layout(parts: list[Part]) -> tuple[tuple[ExpertTensor, ...], int]:
    """Each tensor's place in the record, and the record's size."""
    tensors, offset = [], 0
    for name, dtype, shape, data in parts:
        nbytes = data if isinstance(data, int) else len(data)
        tensors.append(ExpertTensor(name, dtype, shape, offset, nbytes))
        offset = align(offset + nbytes, TENSOR_ALIGN)
    return tuple(tensors), align(max(offset, 1), RECORD_ALIGN)


def write_layer(
    recipe: Recipe,
    out: Path,
    index: int,
    module: str,
    warnings: NonfiniteWarnings,
    on_expert=lambda: None,
) -> MoeLayer:
    """Write layer `index` (container `module`) to `out/experts/NNN.bin`, fsynced; `on_expert`
    is called after each expert (a progress bar)."""
    container = recipe.containers[module]
    rel = layer_file(index)
    tensors: tuple[ExpertTensor, ...] = ()
    size = 0
    offsets, crcs = [], []
    with open(out / rel, "wb") as f:
        for expert in range(recipe.num_experts):
            parts = expert_parts(recipe, module, container, expert)
            if expert == 0:
                tensors, size = layout(parts)
            record = bytearray(size)
            expert_crc = []
            for tensor, (name, dtype, shape, data) in zip(tensors, parts):
                if (name, dtype, shape) != (tensor.name, tensor.dtype, tensor.shape):
                    raise StreamerError(
                        f"{recipe.folder}: {module} expert {expert} tensor {name} is "
                        f"{dtype}{list(shape)}, but expert 0 has "
                        f"{tensor.dtype}{list(tensor.shape)}."
                    )
                record[tensor.offset : tensor.offset + tensor.nbytes] = data
                expert_crc.append(zlib.crc32(data))
                warnings.check(f"{module} expert {expert} tensor {name}", dtype, data)
            offsets.append(expert * size)
            crcs.append(tuple(expert_crc))
            f.write(record)
            on_expert()
        f.flush()
        os.fsync(f.fileno())
    return MoeLayer(
        module,
        rel,
        recipe.num_experts,
        size,
        quantization_of(container),
        tensors,
        tuple(offsets),
        tuple(crcs),
    )


def write_resident(
    recipe: Recipe, items: list[tuple[str, mx.array]], path: Path, written
) -> dict[str, int]:
    """Write the resident weights `items` (recipe.resident_items()) to `path`; return each one's
    crc32. The model and the checkpoint's lazily loaded shards let them go first, so each is
    freed once written: they held them all to the end (DeepSeek-V3's 34 GB from its FP8
    download, whose largest is 1.9 GB)."""
    recipe.model.update(tree_unflatten([(name, mx.array(0)) for name, _ in items]))
    recipe.sources.ckpt.forget_lazy()
    return write_safetensors(path, items, written=written, release=True)


def layer_file(index: int) -> str:
    return f"experts/{index:03d}.bin"


def matches_recipe(recipe: Recipe, index: int, layer: MoeLayer) -> bool:
    """Is `layer` (as an interrupted run recorded it) what this recipe writes for layer `index`:
    same module, file, expert count, quantization and record layout?"""
    modules = list(recipe.containers)
    if not 0 <= index < len(modules):
        return False
    module = modules[index]
    container = recipe.containers[module]
    expected = (module, layer_file(index), recipe.num_experts, quantization_of(container))
    if (layer.module, layer.file, layer.num_experts, layer.quantization) != expected:
        return False
    sized = layout(expert_parts(recipe, module, container, 0, read=False))  # from the headers
    return sized == (layer.tensors, layer.record_bytes)


def expert_parts(
    recipe: Recipe, module: str, container: nn.Module, expert: int, read: bool = True
) -> list[Part]:
    """Each of one expert's tensors, in record order: copied from the source, or with --quantize
    made as `mlx_lm.convert --quantize` makes them. With `read` False, nothing is read: each
    part's byte count, from the tensor headers and lazy arrays never evaluated."""
    source = recipe.sources.read if read else recipe.sources.describe
    parts = []
    for proj in container_projections(container):
        target = container[proj]
        kinds = [k for k in KIND_ORDER if k in target and target[k] is not None]
        if recipe.quantize is None:
            for kind in kinds:
                shape = tuple(target[kind].shape[1:])
                dtype, data = source(module, proj, kind, expert, shape, target[kind].dtype)
                parts.append((f"{proj}.{kind}", dtype, shape, data))
            continue
        for kind, arr in _quantized(recipe, module, proj, target, kinds, expert, read).items():
            if read:
                arr = mx.contiguous(arr)
                mx.eval(arr)
            data = bytes(memoryview(arr).cast("B")) if read else arr.nbytes
            parts.append((f"{proj}.{kind}", MLX_TO_SAFETENSORS[arr.dtype], tuple(arr.shape), data))
    return parts


def _quantized(
    recipe: Recipe,
    module: str,
    proj: str,
    target: nn.Module,
    kinds: list[str],
    expert: int,
    read: bool,
) -> dict[str, mx.array]:
    def array(kind: str, shape: tuple[int, ...], expected: mx.Dtype | None = None) -> mx.array:
        """One expert's `proj.kind` (read, or a lazy stand-in), cast like `mlx_lm.convert` casts
        the model."""
        if read:
            dtype, data = recipe.sources.read(module, proj, kind, expert, shape, expected)
            arr = to_mlx(data, dtype, shape)
        else:
            dtype, _ = recipe.sources.describe(module, proj, kind, expert, shape, expected)
            arr = mx.zeros(shape, DTYPES[dtype][1])
        if recipe.cast is not None and mx.issubdtype(arr.dtype, mx.floating):
            arr = arr.astype(recipe.cast)
        return arr

    if f"{module}.{proj}" in recipe.prequantized:  # e.g. gpt-oss's MXFP4 experts: kept as they are
        return {kind: array(kind, tuple(target[kind].shape[1:])) for kind in kinds}
    produced = {}
    weight = array("weight", (target.output_dims, target.input_dims), mx.float32)
    if isinstance(target, QuantizedSwitchLinear):
        q = mx.quantize(weight, target.group_size, target.bits, mode=target.mode)
        produced.update(zip(("weight", "scales", "biases"), q))
    else:
        produced["weight"] = weight
    if "bias" in kinds:
        produced["bias"] = array("bias", (target.output_dims,))
    return {kind: produced[kind] for kind in kinds}
