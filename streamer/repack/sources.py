"""Where each expert tensor's bytes come from: how each checkpoint convention maps onto records.

A source checkpoint holds an expert container's weights in one of these conventions:
  stacked     mlx-lm's names, one tensor per projection with experts on the first axis (MLX
              conversions): an expert is its rows of the tensor
  per-expert  Hugging Face's `{parent}.experts.{e}.{projection}.{kind}`, with the family's names
              (`Architecture`): an expert is its tensors
  fused       tensors holding a whole layer's experts in a layout of the family's own (Qwen3.5's
              and Gemma 4's `experts.gate_up_proj`, Llama 4's transposed one, Granite's
              `input_linear`, gpt-oss's MXFP4 blocks, DBRX's `experts.mlp.w1` [E*F, D] read as
              [E, F, D]), found by asking sanitize: it converts each expert's slice
  converted   per-expert tensors in another form (FP8 with `weight_scale_inv`, compressed-tensors'
              int4 `weight_packed`): sanitize converts each expert's tensors; compressed-tensors'
              FP4 packs are MLX's packing renamed (packed_fp4.py), copied as per-expert tensors
A new naming convention is a new entry of `architectures.NAMING`; a new layout needs nothing here
when mlx-lm's sanitize reads it.
"""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError
from ..families.hf_naming import Architecture, hf_expert_key
from ..io.checkpoint import Checkpoint
from ..io.safetensors import DTYPES, MLX_TO_SAFETENSORS, TensorInfo, to_mlx
from .dtypes import check_dtype, check_once, check_read
from .fused import find_fused, header_array, try_sanitize
from .layouts import Sanitize
from .packed_fp4 import as_words, fp4_pack_kinds

# an expert's tensors of one projection, in record order (`global_scale`: NVFP4's one tensor scale
# per expert, a scalar)
KIND_ORDER = ("weight", "scales", "biases", "global_scale", "bias")


class Sources:
    """The source tensors of every expert of `containers`, found once from the tensor table."""

    def __init__(
        self,
        ckpt: Checkpoint,
        arch: Architecture,
        containers: dict[str, nn.Module],
        num_experts: int,
        sanitize: Sanitize,
        sanitized: dict[str, mx.array],
    ):
        """`sanitized`: what sanitize makes of the whole checkpoint (lazy, never evaluated)."""
        self.ckpt, self.arch, self.num_experts, self.sanitize = ckpt, arch, num_experts, sanitize
        parents = {p: path for path in containers for p in arch.hf_parents(path)}
        per_expert_key = self._per_expert_key = hf_expert_key(arch)
        packed_kinds = fp4_pack_kinds(ckpt.config)
        self.stacked: dict[tuple[str, str, str], TensorInfo] = {}
        self.per_expert: dict[tuple[str, str, str], dict[int, TensorInfo]] = {}
        candidates: dict[str, TensorInfo] = {}
        resident: dict[str, TensorInfo] = {}
        for name, info in ckpt.tensors.items():
            info = _expert_rows(info, arch, num_experts)
            prefix = name.rsplit(".", 2)[0]
            match = per_expert_key.match(name)
            if prefix in containers:
                _, proj, kind = name.rsplit(".", 2)
                self.stacked[(prefix, proj, kind)] = info
            elif match and match["parent"] in parents and match["proj"] in arch.hf_projections:
                kind = packed_kinds.get(match["kind"], match["kind"])
                if kind != match["kind"] and kind == "weight":
                    info = as_words(info)
                key = (parents[match["parent"]], arch.hf_projections[match["proj"]], kind)
                per, expert = self.per_expert.setdefault(key, {}), int(match["expert"])
                check_once(per.get(expert), info, f"expert {expert}'s {key[1]}.{kind}")
                per[expert] = info
            elif name not in sanitized and info.shape[:1] == (num_experts,):
                candidates[name] = info  # renamed or converted by sanitize: maybe fused experts
            else:
                resident[name] = info
        kinds: dict[tuple[str, str], set[str]] = {}
        for (module, proj, kind), per in self.per_expert.items():
            kinds.setdefault((module, proj), set()).add(kind)
            check_once(self.stacked.get((module, proj, kind)), next(iter(per.values())), "the same")
        self.converted: dict[str, dict[str, set[str]]] = {}  # module -> projection -> source kinds
        for (module, proj), found in kinds.items():
            if not found <= set(KIND_ORDER):
                self.converted.setdefault(module, {})[proj] = found
                self._refuse_unread(module, proj, found)
        self.fused, self._alone, self._stand_ins = find_fused(
            ckpt.folder, sanitize, candidates, resident, containers
        )
        self._converted_cache: tuple[tuple, dict[str, mx.array]] | None = None

    def _refuse_unread(self, module: str, proj: str, kinds: set[str]) -> None:
        """Refuse a kind sanitize leaves unread in one expert's lazy stand-ins (`check_read`)."""
        infos = {k: next(iter(self.per_expert[(module, proj, k)].values())) for k in kinds}
        one = {self._neutral(i, k): mx.zeros(i.shape, DTYPES[i.dtype][1]) for k, i in infos.items()}
        read = try_sanitize(self.sanitize, one)
        check_read(infos, {n.rsplit(".", 1)[1] for n in read}, KIND_ORDER)

    def _fused_expert(self, module: str, expert: int, array) -> dict[str, mx.array]:
        """What sanitize makes of one expert's slice of `module`'s fused tensors (an expert axis of
        1), with the other layers' stand-ins alongside where sanitize needs them."""
        one = {}
        for name, info in self.fused[module].items():
            per = info.nbytes // self.num_experts
            one[name] = array(info, (1, *info.shape[1:]), expert * per)
        weights = one if module in self._alone else {**self._stand_ins, **one}
        out = self.sanitize(weights)
        return {n[len(module) + 1 :]: a[0] for n, a in out.items() if n.startswith(module + ".")}

    def read(
        self,
        module: str,
        proj: str,
        kind: str,
        expert: int,
        shape: tuple[int, ...],
        expected: mx.Dtype | None = None,
    ) -> tuple[str, bytes]:
        """(safetensors dtype, bytes) of one expert's `proj.kind`: its rows of a stacked tensor,
        its own tensor, or what sanitize makes of its source tensors (`_converted`). A source
        tensor whose dtype cannot stand for `expected` is refused."""
        found = self._source(module, proj, kind, expert, shape, expected)
        if found is None:
            arr = self._converted(module, proj, kind, expert, shape, self._read_array)
            arr = mx.contiguous(arr)
            mx.eval(arr)
            return MLX_TO_SAFETENSORS[arr.dtype], bytes(memoryview(arr).cast("B"))
        info, start, length = found
        return info.dtype, self.ckpt.read(info, start, length)

    def describe(
        self,
        module: str,
        proj: str,
        kind: str,
        expert: int,
        shape: tuple[int, ...],
        expected: mx.Dtype | None = None,
    ) -> tuple[str, int]:
        """(safetensors dtype, byte count) of what `read` gives, checked as it checks them, from the
        tensor headers alone: sanitize's conversions run on lazy stand-ins, never evaluated."""
        found = self._source(module, proj, kind, expert, shape, expected)
        if found is None:
            arr = self._converted(module, proj, kind, expert, shape, header_array)
            return MLX_TO_SAFETENSORS[arr.dtype], arr.nbytes
        info, _, length = found
        return info.dtype, length

    def _source(
        self,
        module: str,
        proj: str,
        kind: str,
        expert: int,
        shape: tuple[int, ...],
        expected: mx.Dtype | None,
    ) -> tuple[TensorInfo, int, int] | None:
        """The source tensor of one expert's `proj.kind` and the expert's bytes in it (start,
        length), its shape and dtype checked; None where sanitize converts it."""
        key = (module, proj, kind)
        if key in self.stacked:
            info = self.stacked[key]
            if info.shape != (self.num_experts, *shape):
                raise StreamerError(
                    f"{info.path}: tensor '{info.name}' has shape {list(info.shape)}, expected "
                    f"{[self.num_experts, *shape]} from config.json."
                )
            if expected is not None:
                check_dtype(info, expected)
            per = info.nbytes // self.num_experts
            return info, expert * per, per
        if module in self.fused or proj in self.converted.get(module, ()):
            return None
        info = self._per_expert(module, proj, kind, expert)
        if info.shape != shape:
            raise StreamerError(
                f"{info.path}: tensor '{info.name}' has shape {list(info.shape)}, expected "
                f"{list(shape)} from config.json."
            )
        if expected is not None:
            check_dtype(info, expected)
        return info, 0, info.nbytes

    def _read_array(self, info: TensorInfo, shape: tuple[int, ...], start: int) -> mx.array:
        """`shape`'s bytes of tensor `info` from byte `start`, as an array."""
        length = info.nbytes * math.prod(shape) // max(math.prod(info.shape), 1)
        return to_mlx(self.ckpt.read(info, start, length), info.dtype, shape)

    def _converted(
        self, module: str, proj: str, kind: str, expert: int, shape: tuple[int, ...], array
    ) -> mx.array:
        """Exactly what mlx-lm's sanitize makes of one expert's source tensors, with sanitize run on
        that expert's tensors alone (`array` gives each: read, or a stand-in): its slice of each
        fused tensor (with an expert axis of 1), or its own tensors in another form (FP8 and block
        scales, under a neutral name so that sanitize converts them without stacking a layer).
        One expert's results are kept for the next projection's call."""
        key = (module, expert, array)
        if self._converted_cache is None or self._converted_cache[0] != key:
            self._converted_cache = (key, self._convert(module, expert, array))
        arr = self._converted_cache[1].get(f"{proj}.{kind}")
        if arr is None or tuple(arr.shape) != shape:
            found = "nothing" if arr is None else f"shape {list(arr.shape)}"
            raise StreamerError(
                f"{self.ckpt.folder}: the source tensors of {module} expert {expert} give {found} "
                f"for '{proj}.{kind}', expected {list(shape)} from config.json."
            )
        return arr

    def _convert(self, module: str, expert: int, array) -> dict[str, mx.array]:
        out = {}
        if module in self.fused:
            out.update(self._fused_expert(module, expert, array))
        for proj, kinds in self.converted.get(module, {}).items():
            one = {}
            for kind in kinds:
                info = self._per_expert(module, proj, kind, expert)
                one[self._neutral(info, kind)] = array(info, info.shape, 0)
            out.update(
                {
                    f"{proj}.{name.rsplit('.', 1)[1]}": arr
                    for name, arr in self.sanitize(one).items()
                }
            )
        return out

    def _neutral(self, info: TensorInfo, kind: str) -> str:
        """One expert's source tensor named so that sanitize converts it without stacking a layer:
        under its parent (a family's sanitize may look for it there: Kimi K2.5's text model under
        `language_model`), not as an expert of it."""
        return f"{self._per_expert_key.match(info.name)['parent']}.expert.{kind}"

    def _per_expert(self, module: str, proj: str, kind: str, expert: int) -> TensorInfo:
        info = self.per_expert.get((module, proj, kind), {}).get(expert)
        if info is None:
            parent = f"{self.arch.hf_parent(module)}.{self.arch.hf_experts}"
            hf_name = next((h for h, m in self.arch.hf_projections.items() if m == proj), proj)
            raise StreamerError(
                f"{self.ckpt.folder}: tensor '{parent}.{expert}.{hf_name}.{kind}' (or "
                f"stacked '{module}.{proj}.{kind}') is missing: the download is incomplete."
            )
        return info


def _expert_rows(info: TensorInfo, arch: Architecture, num_experts: int) -> TensorInfo:
    """A fused tensor holding each expert's rows one after another (`hf_expert_rows`: DBRX's
    [E*F, D]), viewed with the experts on an axis of their own ([E, F, D]): the same bytes."""
    if not any(part in info.name for part in arch.hf_expert_rows):
        return info
    if not info.shape or info.shape[0] % num_experts:
        raise StreamerError(
            f"{info.path}: tensor '{info.name}' has shape {list(info.shape)}, expected the rows "
            f"of {num_experts} experts (from config.json)."
        )
    return dataclasses.replace(
        info, shape=(num_experts, info.shape[0] // num_experts, *info.shape[1:])
    )
