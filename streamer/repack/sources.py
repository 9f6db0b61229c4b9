"""Where each expert tensor's bytes come from: how each checkpoint convention maps onto records.

A source checkpoint holds an expert container's weights in one of these conventions:
  stacked     mlx-lm's names, one tensor per projection with experts on the first axis (MLX
              conversions): an expert is its rows of the tensor
  per-expert  Hugging Face's `{parent}.experts.{e}.{projection}.{kind}`: an expert is its tensors
  fused       one Hugging Face tensor for a whole layer in another layout (`Architecture.hf_fused`,
              e.g. gpt-oss's MXFP4 blocks): sanitize converts each expert's slice
  converted   per-expert tensors in another form (FP8 with `weight_scale_inv`): sanitize converts
              each expert's tensors
A new naming convention is a new branch of `Sources.__init__` and of `Sources.read`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..architectures import HF_EXPERT_KEY, HF_FUSED_KEY, Architecture
from ..errors import StreamerError
from ..io.checkpoint import Checkpoint
from ..io.safetensors import DTYPES, MLX_TO_SAFETENSORS, TensorInfo, to_mlx

KIND_ORDER = ("weight", "scales", "biases", "bias")

Sanitize = Callable[[dict[str, mx.array]], dict[str, mx.array]]


def sanitizer(model: nn.Module, folder: Path) -> Sanitize:
    """mlx-lm's own sanitize (source names -> mlx-lm's names); a missing tensor: a clear error."""
    if not hasattr(model, "sanitize"):
        return lambda weights: weights

    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        try:
            return model.sanitize(weights)
        except KeyError as e:
            raise StreamerError(
                f"{folder}: tensor {e.args[0]!r} is missing: the download is incomplete."
            ) from None

    return sanitize


class Sources:
    """The source tensors of every expert of `containers`, found once from the tensor table."""

    def __init__(
        self,
        ckpt: Checkpoint,
        arch: Architecture,
        containers: dict[str, nn.Module],
        num_experts: int,
        sanitize: Sanitize,
    ):
        self.ckpt, self.arch, self.num_experts, self.sanitize = ckpt, arch, num_experts, sanitize
        parents = {path.rsplit(".", 1)[0]: path for path in containers}
        self.stacked: dict[tuple[str, str, str], TensorInfo] = {}
        self.per_expert: dict[tuple[str, str, str], dict[int, TensorInfo]] = {}
        fused: dict[str, dict[str, TensorInfo]] = {}
        for name, info in ckpt.tensors.items():
            prefix = name.rsplit(".", 2)[0]
            match = HF_EXPERT_KEY.match(name)
            packed = HF_FUSED_KEY.match(name)
            if prefix in containers:
                _, proj, kind = name.rsplit(".", 2)
                self.stacked[(prefix, proj, kind)] = info
            elif match and match["parent"] in parents and match["proj"] in arch.hf_projections:
                key = (parents[match["parent"]], arch.hf_projections[match["proj"]], match["kind"])
                self.per_expert.setdefault(key, {})[int(match["expert"])] = info
            elif packed and packed["name"] in arch.hf_fused:
                fused.setdefault(packed["parent"], {})[name] = info
            elif packed and packed["parent"] in parents:
                raise StreamerError(
                    f"{info.path}: tensor '{name}' holds experts in a layout streamer does not "
                    f"read for {ckpt.config.get('model_type')}; use the checkpoint as published "
                    "or an MLX-converted one."
                )
        kinds: dict[tuple[str, str], set[str]] = {}
        for module, proj, kind in self.per_expert:
            kinds.setdefault((module, proj), set()).add(kind)
        self.converted: dict[str, dict[str, set[str]]] = {}  # module -> projection -> source kinds
        for (module, proj), found in kinds.items():
            if not found <= set(KIND_ORDER):
                self.converted.setdefault(module, {})[proj] = found
        self.fused = {
            module: group
            for group in fused.values()
            if (module := self._fused_module(group, containers)) is not None
        }
        self._converted_cache: tuple[tuple[str, int], dict[str, mx.array]] | None = None

    def _fused_module(
        self, group: dict[str, TensorInfo], containers: dict[str, nn.Module]
    ) -> str | None:
        """Which expert container a layer's fused tensors feed (None: one the model does not use,
        e.g. multi-token prediction layers), asking sanitize about a one-expert stand-in."""
        probe = self.sanitize(
            {n: mx.zeros((1, *i.shape[1:]), DTYPES[i.dtype][1]) for n, i in group.items()}
        )
        if not probe:
            return None
        modules = {name.rsplit(".", 2)[0] for name in probe}
        if len(modules) != 1 or not modules <= containers.keys():
            raise StreamerError(
                f"{self.ckpt.folder}: cannot tell which MoE layer holds {sorted(group)}."
            )
        for info in group.values():
            if info.shape[:1] != (self.num_experts,):
                raise StreamerError(
                    f"{info.path}: tensor '{info.name}' has shape {list(info.shape)}, expected "
                    f"{self.num_experts} experts on its first axis from config.json."
                )
        return modules.pop()

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
            return info.dtype, self.ckpt.read(info, expert * per, per)
        if module in self.fused or proj in self.converted.get(module, ()):
            return self._converted(module, proj, kind, expert, shape)
        info = self._per_expert(module, proj, kind, expert)
        if info.shape != shape:
            raise StreamerError(
                f"{info.path}: tensor '{info.name}' has shape {list(info.shape)}, expected "
                f"{list(shape)} from config.json."
            )
        if expected is not None:
            check_dtype(info, expected)
        return info.dtype, self.ckpt.read(info)

    def _converted(
        self, module: str, proj: str, kind: str, expert: int, shape: tuple[int, ...]
    ) -> tuple[str, bytes]:
        """Exactly what mlx-lm's sanitize makes of one expert's source tensors, with sanitize run on
        that expert's bytes alone: its slice of each fused tensor (read with an expert axis of 1),
        or its own tensors in another form (FP8 and block scales, under a neutral name so that
        sanitize converts them without stacking a layer). One expert's results are kept for the
        next projection's call."""
        if self._converted_cache is None or self._converted_cache[0] != (module, expert):
            self._converted_cache = ((module, expert), self._convert(module, expert))
        arr = self._converted_cache[1].get(f"{proj}.{kind}")
        if arr is None or tuple(arr.shape) != shape:
            found = "nothing" if arr is None else f"shape {list(arr.shape)}"
            raise StreamerError(
                f"{self.ckpt.folder}: the source tensors of {module} expert {expert} give {found} "
                f"for '{proj}.{kind}', expected {list(shape)} from config.json."
            )
        arr = mx.contiguous(arr)
        mx.eval(arr)
        return MLX_TO_SAFETENSORS[arr.dtype], bytes(memoryview(arr).cast("B"))

    def _convert(self, module: str, expert: int) -> dict[str, mx.array]:
        out = {}
        if module in self.fused:
            one = {}
            for name, info in self.fused[module].items():
                per = info.nbytes // self.num_experts
                data = self.ckpt.read(info, expert * per, per)
                one[name] = to_mlx(data, info.dtype, (1, *info.shape[1:]))
            out.update(
                {name[len(module) + 1 :]: arr[0] for name, arr in self.sanitize(one).items()}
            )
        for proj, kinds in self.converted.get(module, {}).items():
            one = {}
            for kind in kinds:
                info = self._per_expert(module, proj, kind, expert)
                one[f"expert.{kind}"] = to_mlx(self.ckpt.read(info), info.dtype, info.shape)
            out.update(
                {
                    f"{proj}.{name.rsplit('.', 1)[1]}": arr
                    for name, arr in self.sanitize(one).items()
                }
            )
        return out

    def _per_expert(self, module: str, proj: str, kind: str, expert: int) -> TensorInfo:
        info = self.per_expert.get((module, proj, kind), {}).get(expert)
        if info is None:
            parent = module.rsplit(".", 1)[0]
            hf_name = next((h for h, m in self.arch.hf_projections.items() if m == proj), proj)
            raise StreamerError(
                f"{self.ckpt.folder}: tensor '{parent}.experts.{expert}.{hf_name}.{kind}' (or "
                f"stacked '{module}.{proj}.{kind}') is missing: the download is incomplete."
            )
        return info


def compatible(got: mx.Dtype, expected: mx.Dtype) -> bool:
    """Any float width can stand for a float parameter (it is cast); integer data must match."""
    if mx.issubdtype(expected, mx.floating):
        return mx.issubdtype(got, mx.floating)
    return got == expected


def describe(dtype: mx.Dtype) -> str:
    return (
        "a floating-point tensor"
        if mx.issubdtype(dtype, mx.floating)
        else MLX_TO_SAFETENSORS.get(dtype, str(dtype))
    )


def check_dtype(info: TensorInfo, expected: mx.Dtype) -> None:
    if not compatible(DTYPES[info.dtype][1], expected):
        raise StreamerError(
            f"{info.path}: tensor '{info.name}' is {info.dtype} but config.json implies "
            f"{describe(expected)}: the checkpoint is corrupt or config.json belongs to another "
            "model."
        )
