"""The repacker: a downloaded checkpoint -> the streaming layout (see streamer/io/manifest.py).

It works expert by expert: peak memory is one expert plus the resident (non-expert) weights,
which are written one tensor at a time. Output goes to a hidden `.NAME.partial` folder that is
renamed into place only when complete, so an interrupted repack never leaves a folder that looks
valid. An interruption (Ctrl-C, a full disk, a kill) keeps the finished layers there, and
`resume=True` continues from them (see streamer/resume.py). The source is only ever read.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.models.switch_layers import QuantizedSwitchLinear
from mlx_lm.utils import quantize_model

from . import architectures
from .architectures import (
    Architecture,
    architecture,
    build_model,
    container_projections,
    expert_containers,
    normalize_config,
    quantize_like_mlx_lm,
)
from .errors import StreamerError
from .io.checkpoint import INDEX_FILE, Checkpoint
from .io.integrity import file_stat
from .io.lock import lock_directory, lock_for_replacing
from .io.manifest import (
    PAGE_SIZE,
    RESIDENT_FILE,
    TENSOR_ALIGN,
    ExpertTensor,
    Manifest,
    MoeLayer,
    align,
    read_manifest,
    write_manifest,
)
from .io.safetensors import (
    DTYPES,
    MLX_TO_SAFETENSORS,
    TensorInfo,
    nonfinite_count,
    read_header,
    to_mlx,
    write_safetensors,
)
from .resume import Progress, source_identity

KIND_ORDER = ("weight", "scales", "biases", "bias")
CONVERSION_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt")
MAX_NONFINITE_WARNINGS = 20


@dataclass
class Quantize:
    bits: int
    group_size: int = 64


def repack(
    src: str | Path,
    dst: str | Path,
    *,
    quantize: Quantize | None = None,
    force: bool = False,
    resume: bool = False,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
) -> Manifest:
    """Repack checkpoint folder `src` into streaming folder `dst`; return the written manifest.

    With `resume`, continue an interrupted repack into `dst` from its last finished layer.
    """
    src, dst = Path(src), Path(dst)
    partial = dst.parent / f".{dst.name}.partial"
    if resume and dst.exists() and not partial.exists():
        log(f"[repack] {dst} is complete: nothing to resume")
        return read_manifest(dst)
    if dst.exists() and not force:
        raise StreamerError(
            f"{dst} already exists: choose another destination or pass --force to replace it."
        )
    if dst.resolve() == src.resolve():
        raise StreamerError(f"{dst} is the source folder: choose another destination.")
    with Checkpoint(src) as ckpt:
        plan = _Plan(ckpt, quantize)
        identity = source_identity(
            ckpt, {"quantize": quantize and [quantize.bits, quantize.group_size]}
        )
        readers = (
            lock_for_replacing(dst) if dst.exists() else None
        )  # refuse while a model reads dst
        partial_fd, progress = _open_partial(partial, identity, resume, log)
        try:
            plan.check_disk(partial, progress)  # a refusal here keeps resumable work as it is
            manifest = _write_and_publish(plan, partial, dst, progress, log)
        except StreamerError:
            if not progress.started:
                shutil.rmtree(partial, ignore_errors=True)  # nothing written: leave nothing behind
            raise
        finally:
            if partial_fd is not None:
                os.close(partial_fd)
            if readers is not None:
                readers.release()
    log(
        f"[repack] done: {dst} ({manifest.expert_bytes / 1e9:.2f} GB of experts in {len(manifest.layers)} MoE layers)"
    )
    return manifest


def _write_and_publish(
    plan: _Plan, partial: Path, dst: Path, progress: Progress, log
) -> Manifest:
    try:
        manifest = plan.write(partial, log, progress)
        progress.remove()
        _publish(partial, dst)
    except BaseException as e:
        failure = _failed(e, partial, progress, plan, log)
        if failure is e:
            raise
        raise failure from e
    return manifest


def _open_partial(partial: Path, identity: str, resume: bool, log) -> tuple[int | None, Progress]:
    """Lock the `.DST.partial` folder against other repacks and pick up its progress if resuming."""
    if partial.exists():
        fd = lock_directory(partial, "writing the same destination")
        try:
            progress = Progress.load(partial, identity) if resume else None
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        if progress is not None:
            log(f"[repack] resuming {partial}: {len(progress.layers)} MoE layer(s) already done")
            return fd, progress
        log(
            f"[repack] removing the unfinished repack in {partial}"
            + ("" if resume else " (--resume continues one)")
        )
        shutil.rmtree(partial)
        if fd is not None:
            os.close(fd)
    elif resume:
        log("[repack] nothing to resume: starting from the beginning")
    (partial / "experts").mkdir(parents=True)
    return lock_directory(partial, "writing the same destination"), Progress(partial, identity)


def _failed(
    error: BaseException, partial: Path, progress: Progress, plan: _Plan, log
) -> BaseException:
    """Keep the finished work after an interruption, an I/O error (disk full...) or a crash so that
    --resume continues it; delete it after a StreamerError (bad input: nothing worth keeping)."""
    keep = not isinstance(error, StreamerError) and progress.started and partial.exists()
    if not keep:
        shutil.rmtree(partial, ignore_errors=True)
        return error
    done = f"{len(progress.layers)}/{len(plan.containers)} MoE layers are kept in {partial}"
    again = (
        f"run the same command with --resume to continue (or delete {partial} to reclaim its space)"
    )
    if not isinstance(error, OSError):
        log(
            f"[repack] {'interrupted' if isinstance(error, KeyboardInterrupt) else 'failed'}: {done}; {again}."
        )
        return error
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return StreamerError(
            f"the disk holding {partial.parent} is full: the repacked model needs about "
            f"{plan.needed_bytes / 1e9:.2f} GB in all. Free space, then {again}. ({done}.)"
        )
    where = f" ({error.filename})" if error.filename else ""
    return StreamerError(
        f"repacking failed with an I/O error: {error.strerror or error}{where}. {done}; {again}."
    )


def _publish(partial: Path, dst: Path) -> None:
    _fsync_dir(partial / "experts")
    _fsync_dir(partial)
    old = dst.parent / f".{dst.name}.old"
    if dst.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
    os.replace(partial, dst)
    _fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Plan:
    """What goes where: the source tensors of each expert and the resident weights to write."""

    def __init__(self, ckpt: Checkpoint, quantize: Quantize | None):
        self.ckpt = ckpt
        self.quantize = quantize
        where = ckpt.folder / "config.json"
        config = normalize_config(ckpt.config)
        self.arch: Architecture = architecture(config, where)
        if "quantization" not in config and "quantization_config" in config:
            raise StreamerError(
                f"{where}: quantization_config ({config['quantization_config'].get('quant_method', '?')}) is not "
                "supported; repack the bf16/fp16 checkpoint (optionally with --quantize) or an MLX-quantized one."
            )
        # MLX-quantized checkpoints are refused; a published MXFP4 gpt-oss is not (its MXFP4 experts are
        # kept and the other weights quantized, as `mlx_lm.convert --quantize` does)
        if quantize and "quantization" in ckpt.config:
            raise StreamerError(
                f"{where}: the checkpoint is already quantized; repack it without --quantize."
            )
        self.model = build_model(config, where)
        self.containers = expert_containers(self.model)
        first = next(iter(self.containers.values()))
        self.num_experts = first[container_projections(first)[0]].num_experts
        # mlx-lm's own sanitize maps every source name to mlx-lm's names (and drops what the model does
        # not use); it runs on lazy arrays, so expert tensors it stacks or splits are never read here.
        weights = self._sanitize({name: ckpt.lazy(name) for name in ckpt.tensors})
        if any(name.endswith("_scale_inv") for name in weights):
            raise StreamerError(
                f"{where}: FP8 weights with block scales, which mlx-lm dequantizes for deepseek_v3 / kimi_k2 / "
                f"deepseek_v32 / glm_moe_dsa but not for {config['model_type']}; repack a bf16 or MLX-quantized version."
            )
        self._classify(weights)
        resident = {name: arr for name, arr in weights.items() if not self._in_container(name)}
        quantize_like_mlx_lm(self.model, config, weights)
        # experts the checkpoint already holds quantized are copied as they are, even with --quantize
        self.prequantized = {name.rsplit(".", 1)[0] for name in weights if name.endswith(".scales")}
        self._check_resident(resident)
        self.model.load_weights(list(resident.items()), strict=False)
        self.cast = None
        if quantize:
            config = self._quantize_model(config, quantize)
        self.config = config
        self._converted_cache: tuple[tuple[str, int], dict[str, mx.array]] | None = None

    def _sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        if not hasattr(self.model, "sanitize"):
            return weights
        try:
            return self.model.sanitize(weights)
        except KeyError as e:
            raise StreamerError(
                f"{self.ckpt.folder}: tensor {e.args[0]!r} is missing: the download is incomplete."
            ) from None

    # -- which source tensors are experts ------------------------------------------------------
    def _classify(self, sanitized: dict[str, mx.array]) -> None:
        """Source of each expert tensor: stacked in mlx-lm's names (copied per expert), one tensor per
        expert (Hugging Face), or fused Hugging Face tensors converted per expert by sanitize."""
        parents = {self.arch.hf_parent(path): path for path in self.containers}
        hf_expert_key = architectures.hf_expert_key(self.arch)
        self.stacked: dict[tuple[str, str, str], TensorInfo] = {}
        self.per_expert: dict[tuple[str, str, str], dict[int, TensorInfo]] = {}
        others: dict[str, TensorInfo] = {}
        for name, info in self.ckpt.tensors.items():
            prefix = name.rsplit(".", 2)[0]
            match = hf_expert_key.match(name)
            if prefix in self.containers:
                _, proj, kind = name.rsplit(".", 2)
                self.stacked[(prefix, proj, kind)] = info
            elif match and match["parent"] in parents and match["proj"] in self.arch.hf_projections:
                key = (
                    parents[match["parent"]],
                    self.arch.hf_projections[match["proj"]],
                    match["kind"],
                )
                self.per_expert.setdefault(key, {})[int(match["expert"])] = info
            elif name not in sanitized and info.shape[:1] == (self.num_experts,):
                others[name] = info
        # per-expert tensors in another form (FP8 with `weight_scale_inv`): converted by sanitize too
        kinds: dict[tuple[str, str], set[str]] = {}
        for module, proj, kind in self.per_expert:
            kinds.setdefault((module, proj), set()).add(kind)
        self.converted: dict[str, dict[str, set[str]]] = {}  # module -> projection -> source kinds
        for (module, proj), found in kinds.items():
            if not found <= set(KIND_ORDER):
                self.converted.setdefault(module, {})[proj] = found
        self._find_fused(others)

    def _find_fused(self, candidates: dict[str, TensorInfo]) -> None:
        """Tensors holding all of a layer's experts in a layout of the family's own (Qwen3.5's and
        Gemma 4's `experts.gate_up_proj`, Llama 4's transposed one, Granite's `input_linear`,
        gpt-oss's MXFP4 blocks): sanitize, asked about a one-expert stand-in of each layer's
        tensors, says which expert container they feed. Such layers are converted expert by expert."""
        by_layer: dict[str, dict[str, TensorInfo]] = {}
        for name, info in candidates.items():
            by_layer.setdefault(_layer_prefix(name), {})[name] = info
        self.fused: dict[str, dict[str, TensorInfo]] = {}
        self._fused_context: dict[str, TensorInfo] = {}
        for group in by_layer.values():
            modules = {n.rsplit(".", 2)[0] for n in self._sanitize_one(group, probe=True)}
            modules &= self.containers.keys()
            if not modules:
                continue  # a router, or a part the model does not use (multi-token prediction)
            if len(modules) != 1:
                raise StreamerError(
                    f"{self.ckpt.folder}: cannot tell which MoE layer holds {sorted(group)}."
                )
            self.fused[modules.pop()] = group
            # sanitize often recognises a layout by layer 0's tensors: every later call sees them
            self._fused_context = self._fused_context or group

    def _sanitize_one(self, group: dict[str, TensorInfo], probe: bool = False, expert: int = 0):
        """What sanitize makes of one expert's slice of `group` (an expert axis of 1); with
        `probe`, of stand-ins that are never evaluated. The first fused layer's stand-ins come
        along (sanitize may look for them) and what they give is dropped."""
        one = {}
        for name, info in group.items():
            if probe:
                one[name] = mx.zeros((1, *info.shape[1:]), DTYPES[info.dtype][1])
            else:
                per = info.nbytes // self.num_experts
                one[name] = to_mlx(
                    self.ckpt.read(info, expert * per, per), info.dtype, (1, *info.shape[1:])
                )
        context = {
            n: mx.zeros((1, *i.shape[1:]), DTYPES[i.dtype][1])
            for n, i in self._fused_context.items()
            if n not in one
        }
        dropped = set(self._sanitize(dict(context))) if context else set()
        try:
            out = self._sanitize({**context, **one})
        except Exception:
            if not probe:
                raise
            return {}  # not tensors sanitize converts this way (e.g. a router stand-in)
        return {n: a for n, a in out.items() if n not in dropped}

    def _check_resident(self, resident: dict[str, mx.array]) -> None:
        expected = {
            name: arr
            for name, arr in tree_flatten(self.model.parameters())
            if not self._in_container(name)
        }
        where = self.ckpt.folder
        missing = sorted(set(expected) - set(resident))
        if missing:
            raise StreamerError(
                f"{where}: the checkpoint lacks {len(missing)} non-expert tensor(s), e.g. '{missing[0]}': "
                "the download is incomplete or config.json belongs to another model."
            )
        unexpected = sorted(set(resident) - set(expected))
        if unexpected:
            raise StreamerError(
                f"{where}: tensor '{unexpected[0]}' (and {len(unexpected) - 1} more) is not part of a "
                f"{self.ckpt.config.get('model_type')} model with this config.json."
            )
        for name, arr in resident.items():
            if tuple(arr.shape) != tuple(expected[name].shape):
                raise StreamerError(
                    f"{where}: tensor '{name}' has shape {tuple(arr.shape)} but config.json implies "
                    f"{tuple(expected[name].shape)}."
                )
            if not _compatible(arr.dtype, expected[name].dtype):
                raise StreamerError(
                    f"{where}: tensor '{name}' is {MLX_TO_SAFETENSORS.get(arr.dtype, arr.dtype)} but config.json "
                    f"implies {_describe(expected[name].dtype)}: the checkpoint is corrupt or config.json belongs "
                    "to another model."
                )

    def _in_container(self, name: str) -> bool:
        return any(name.startswith(c + ".") for c in self.containers)

    def _quantize_model(self, config: dict, quantize: Quantize) -> dict:
        """Quantize resident weights as `mlx_lm.convert --quantize` does; experts follow in `_expert`."""
        self.cast = CONVERSION_DTYPES.get(config.get("torch_dtype"))
        if self.cast is not None:
            keep = getattr(self.model, "cast_predicate", lambda _: True)
            self.model.update(
                tree_map_with_path(
                    lambda k, v: (
                        v.astype(self.cast)
                        if keep(k) and mx.issubdtype(v.dtype, mx.floating)
                        else v
                    ),
                    self.model.parameters(),
                )
            )
        with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints its bits-per-weight line
            _, config = quantize_model(self.model, config, quantize.group_size, quantize.bits)
        return config

    # -- writing --------------------------------------------------------------------------------
    def resident_items(self) -> list[tuple[str, mx.array]]:
        return [
            (name, arr)
            for name, arr in tree_flatten(self.model.parameters())
            if not self._in_container(name)
        ]

    def write(self, out: Path, log, progress: Progress) -> Manifest:
        resident_items = self.resident_items()
        self._log, self._nonfinite = log, 0
        log(
            f"[repack] {self.ckpt.folder} -> {len(self.containers)} MoE layers x {self.num_experts} experts"
        )
        if progress.resident is None:
            progress.record_resident(write_safetensors(out / RESIDENT_FILE, resident_items))
            self._check_resident_finite(out / RESIDENT_FILE)
        layers = []
        start = time.perf_counter()
        written = 0
        for index, (module, container) in enumerate(self.containers.items()):
            layer = progress.layers.get(index)
            if layer is not None:
                layers.append(layer)
                log(
                    f"[repack] layer {index + 1}/{len(self.containers)} {module}: kept from the interrupted run"
                )
                continue
            layer = self._write_layer(out, index, module, container)
            progress.record_layer(index, layer)
            layers.append(layer)
            written += layer.file_bytes
            rate = written / max(time.perf_counter() - start, 1e-9) / 1e6
            log(
                f"[repack] layer {index + 1}/{len(self.containers)} {module}: {layer.file_bytes / 1e6:.1f} MB ({rate:.0f} MB/s)"
            )
        if self._nonfinite:
            log(
                f"[repack] warning: {self._nonfinite} tensor(s) hold NaN/Inf values (listed above, up to "
                f"{MAX_NONFINITE_WARNINGS}); this checkpoint will produce garbage. Check or download it again."
            )
        _copy_side_files(self.ckpt.folder, out)
        _write_config(out, self.config)
        # sizes and times as written: load refuses a file changed after this point
        files = {
            name: file_stat(out / name)
            for name in [RESIDENT_FILE, *(layer.file for layer in layers)]
        }
        manifest = Manifest(self.config, progress.resident, tuple(layers), files)
        write_manifest(out, manifest)
        return manifest

    def check_disk(self, out: Path, progress: Progress) -> None:
        """Refuse up front when the disk cannot hold what is left to write (all of it unless resuming)."""
        first_module, first = next(iter(self.containers.items()))
        record = align(
            sum(align(len(b), TENSOR_ALIGN) for *_, b in self._expert(first_module, first, 0)),
            PAGE_SIZE,
        )
        resident = sum(a.nbytes for _, a in self.resident_items())
        self.needed_bytes = record * self.num_experts * len(self.containers) + resident
        left = record * self.num_experts * (len(self.containers) - len(progress.layers))
        left += resident if progress.resident is None else 0
        free = shutil.disk_usage(out).free
        if left > free:
            raise StreamerError(
                f"not enough disk space in {out.parent}: the repacked model needs about {left / 1e9:.2f} GB more, "
                f"{free / 1e9:.2f} GB is free. Free space or choose a destination on another disk."
            )

    def _warn_nonfinite(self, where: str, dtype: str, data) -> None:
        """NaN/Inf weights make plausible-looking garbage downstream: say which tensor, once each."""
        count = nonfinite_count(data, dtype)
        if count:
            self._nonfinite += 1
            if self._nonfinite <= MAX_NONFINITE_WARNINGS:
                self._log(f"[repack] warning: {where} holds {count} NaN/Inf value(s).")

    def _check_resident_finite(self, path: Path) -> None:
        with open(path, "rb") as f:
            for name, info in read_header(path).items():
                f.seek(info.start)
                self._warn_nonfinite(f"resident tensor '{name}'", info.dtype, f.read(info.nbytes))

    def _write_layer(self, out: Path, index: int, module: str, container: nn.Module) -> MoeLayer:
        rel = f"experts/{index:03d}.bin"
        tensors: tuple[ExpertTensor, ...] = ()
        record_bytes = 0
        offsets, crcs = [], []
        with open(out / rel, "wb") as f:
            for expert in range(self.num_experts):
                parts = self._expert(module, container, expert)
                if expert == 0:
                    tensors, record_bytes = _layout(parts)
                record = bytearray(record_bytes)
                expert_crc = []
                for tensor, (name, dtype, shape, data) in zip(tensors, parts):
                    if (name, dtype, shape) != (tensor.name, tensor.dtype, tensor.shape):
                        raise StreamerError(
                            f"{self.ckpt.folder}: {module} expert {expert} tensor {name} is {dtype}{list(shape)}, "
                            f"but expert 0 has {tensor.dtype}{list(tensor.shape)}."
                        )
                    record[tensor.offset : tensor.offset + tensor.nbytes] = data
                    expert_crc.append(zlib.crc32(data))
                    self._warn_nonfinite(f"{module} expert {expert} tensor {name}", dtype, data)
                offsets.append(expert * record_bytes)
                crcs.append(tuple(expert_crc))
                f.write(record)
            f.flush()
            os.fsync(f.fileno())
        quantization = {
            proj: (
                {"group_size": m.group_size, "bits": m.bits, "mode": m.mode}
                if isinstance(m := container[proj], QuantizedSwitchLinear)
                else None
            )
            for proj in container_projections(container)
        }
        return MoeLayer(
            module,
            rel,
            self.num_experts,
            record_bytes,
            quantization,
            tensors,
            tuple(offsets),
            tuple(crcs),
        )

    def _expert(
        self, module: str, container: nn.Module, expert: int
    ) -> list[tuple[str, str, tuple[int, ...], bytes]]:
        """(name, dtype, shape, bytes) of each of one expert's tensors, in record order."""
        parts = []
        for proj in container_projections(container):
            target = container[proj]
            kinds = [k for k in KIND_ORDER if k in target and target[k] is not None]
            if self.quantize is None:
                for kind in kinds:
                    shape = tuple(target[kind].shape[1:])
                    dtype, data = self._source(
                        module, proj, kind, expert, shape, target[kind].dtype
                    )
                    parts.append((f"{proj}.{kind}", dtype, shape, data))
                continue
            produced = {}
            if (
                f"{module}.{proj}" in self.prequantized
            ):  # e.g. gpt-oss's MXFP4 experts: kept as they are
                for kind in kinds:
                    produced[kind] = self._array(
                        module, proj, kind, expert, tuple(target[kind].shape[1:])
                    )
            else:
                weight = self._array(
                    module,
                    proj,
                    "weight",
                    expert,
                    (target.output_dims, target.input_dims),
                    mx.float32,
                )
                if isinstance(target, QuantizedSwitchLinear):
                    q = mx.quantize(weight, target.group_size, target.bits, mode=target.mode)
                    produced.update(zip(("weight", "scales", "biases"), q))
                else:
                    produced["weight"] = weight
                if "bias" in kinds:
                    produced["bias"] = self._array(
                        module, proj, "bias", expert, (target.output_dims,)
                    )
            for kind in kinds:
                arr = mx.contiguous(produced[kind])
                mx.eval(arr)
                parts.append(
                    (
                        f"{proj}.{kind}",
                        MLX_TO_SAFETENSORS[arr.dtype],
                        tuple(arr.shape),
                        bytes(memoryview(arr).cast("B")),
                    )
                )
        return parts

    def _array(
        self,
        module: str,
        proj: str,
        kind: str,
        expert: int,
        shape: tuple[int, ...],
        expected: mx.Dtype | None = None,
    ) -> mx.array:
        """One expert's `proj.kind` as an array, cast like `mlx_lm.convert` casts the model."""
        dtype, data = self._source(module, proj, kind, expert, shape, expected)
        arr = to_mlx(data, dtype, shape)
        if self.cast is not None and mx.issubdtype(arr.dtype, mx.floating):
            arr = arr.astype(self.cast)
        return arr

    def _source(
        self,
        module: str,
        proj: str,
        kind: str,
        expert: int,
        shape: tuple[int, ...],
        expected: mx.Dtype | None = None,
    ) -> tuple[str, bytes]:
        """(safetensors dtype, bytes) of one expert's `proj.kind`: its rows of a stacked tensor, its own
        tensor, or what sanitize makes of its source tensors (`_converted_source`). A source tensor
        whose dtype cannot stand for `expected` is refused."""
        key = (module, proj, kind)
        if key in self.stacked:
            info = self.stacked[key]
            if info.shape != (self.num_experts, *shape):
                raise StreamerError(
                    f"{info.path}: tensor '{info.name}' has shape {list(info.shape)}, expected "
                    f"{[self.num_experts, *shape]} from config.json."
                )
            if expected is not None:
                _check_dtype(info, expected)
            per = info.nbytes // self.num_experts
            return info.dtype, self.ckpt.read(info, expert * per, per)
        if module in self.fused or proj in self.converted.get(module, ()):
            return self._converted_source(module, proj, kind, expert, shape)
        info = self._per_expert(module, proj, kind, expert)
        if info.shape != shape:
            raise StreamerError(
                f"{info.path}: tensor '{info.name}' has shape {list(info.shape)}, expected {list(shape)} from config.json."
            )
        if expected is not None:
            _check_dtype(info, expected)
        return info.dtype, self.ckpt.read(info)

    def _converted_source(
        self, module: str, proj: str, kind: str, expert: int, shape: tuple[int, ...]
    ) -> tuple[str, bytes]:
        """Exactly what mlx-lm's sanitize makes of one expert's source tensors, with sanitize run on
        that expert's bytes alone: its slice of each fused tensor (read with an expert axis of 1), or
        its own tensors in another form (FP8 and block scales, under a neutral name so that sanitize
        converts them without stacking a layer)."""
        if self._converted_cache is None or self._converted_cache[0] != (module, expert):
            out = {}
            if module in self.fused:
                one = self._sanitize_one(self.fused[module], expert=expert)
                out.update({n[len(module) + 1 :]: a[0] for n, a in one.items() if n.startswith(module + ".")})
            for p, kinds in self.converted.get(module, {}).items():
                one = {}
                for k in kinds:
                    info = self._per_expert(module, p, k, expert)
                    one[f"expert.{k}"] = to_mlx(self.ckpt.read(info), info.dtype, info.shape)
                out.update(
                    {
                        f"{p}.{name.rsplit('.', 1)[1]}": arr
                        for name, arr in self._sanitize(one).items()
                    }
                )
            self._converted_cache = ((module, expert), out)
        arr = self._converted_cache[1].get(f"{proj}.{kind}")
        if arr is None or tuple(arr.shape) != shape:
            found = "nothing" if arr is None else f"shape {list(arr.shape)}"
            raise StreamerError(
                f"{self.ckpt.folder}: the source tensors of {module} expert {expert} give {found} for "
                f"'{proj}.{kind}', expected {list(shape)} from config.json."
            )
        arr = mx.contiguous(arr)
        mx.eval(arr)
        return MLX_TO_SAFETENSORS[arr.dtype], bytes(memoryview(arr).cast("B"))

    def _per_expert(self, module: str, proj: str, kind: str, expert: int) -> TensorInfo:
        info = self.per_expert.get((module, proj, kind), {}).get(expert)
        if info is None:
            parent = self.arch.hf_parent(module)
            hf_name = next((h for h, m in self.arch.hf_projections.items() if m == proj), proj)
            raise StreamerError(
                f"{self.ckpt.folder}: tensor '{parent}.{self.arch.hf_experts}.{expert}.{hf_name}.{kind}' (or stacked "
                f"'{module}.{proj}.{kind}') is missing: the download is incomplete."
            )
        return info


def _layer_prefix(name: str) -> str:
    """`model.layers.3` of `model.layers.3.mlp.experts.gate_up_proj`: up to the first number."""
    parts = name.split(".")
    number = next((i for i, p in enumerate(parts) if p.isdigit()), len(parts) - 1)
    return ".".join(parts[: number + 1])


def _compatible(got: mx.Dtype, expected: mx.Dtype) -> bool:
    """Any float width can stand for a float parameter (it is cast); integer data must match exactly."""
    if mx.issubdtype(expected, mx.floating):
        return mx.issubdtype(got, mx.floating)
    return got == expected


def _describe(dtype: mx.Dtype) -> str:
    return (
        "a floating-point tensor"
        if mx.issubdtype(dtype, mx.floating)
        else MLX_TO_SAFETENSORS.get(dtype, str(dtype))
    )


def _check_dtype(info: TensorInfo, expected: mx.Dtype) -> None:
    if not _compatible(DTYPES[info.dtype][1], expected):
        raise StreamerError(
            f"{info.path}: tensor '{info.name}' is {info.dtype} but config.json implies {_describe(expected)}: "
            "the checkpoint is corrupt or config.json belongs to another model."
        )


def _layout(parts) -> tuple[tuple[ExpertTensor, ...], int]:
    tensors, offset = [], 0
    for name, dtype, shape, data in parts:
        tensors.append(ExpertTensor(name, dtype, shape, offset, len(data)))
        offset = align(offset + len(data), TENSOR_ALIGN)
    return tuple(tensors), align(max(offset, 1), PAGE_SIZE)


def _copy_side_files(src: Path, out: Path) -> None:
    """Tokenizer, generation config, chat template...: every small file that is not weights."""
    for path in src.iterdir():
        if (
            path.is_file()
            and path.name not in ("config.json", INDEX_FILE)
            and not path.name.endswith(WEIGHT_SUFFIXES)
        ):
            shutil.copy2(path, out / path.name)


def _write_config(out: Path, config: dict) -> None:
    with open(out / "config.json", "w", encoding="utf-8") as f:
        json.dump(dict(sorted(config.items())), f, indent=2)
