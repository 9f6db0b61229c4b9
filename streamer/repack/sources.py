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

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError
from ..families.hf_naming import Architecture, hf_expert_key
from ..io.checkpoint import Checkpoint
from ..io.safetensors import DTYPES, MLX_TO_SAFETENSORS, TensorInfo, to_mlx
from .dtypes import check_dtype, check_once, check_read
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
        per_expert_key = hf_expert_key(arch)
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
        self._find_fused(candidates, resident, containers)
        self._converted_cache: tuple[tuple[str, int], dict[str, mx.array]] | None = None

    def _find_fused(
        self, candidates: dict[str, TensorInfo], resident: dict[str, TensorInfo], containers: dict
    ) -> None:
        """Which expert container each layer's fused tensors feed. Sanitize is asked about
        stand-ins that are never evaluated: the candidates of one layer with an expert axis of 2,
        the other candidates with 1 and the resident tensors as they are (sanitize may read any
        of them): the container tensors with 2 experts come from that layer. Candidates that feed
        none (a router, multi-token prediction layers) are not experts."""
        by_layer: dict[str, dict[str, TensorInfo]] = {}
        for name, info in candidates.items():
            by_layer.setdefault(_layer_prefix(name), {})[name] = info
        self.fused: dict[str, dict[str, TensorInfo]] = {}
        self._alone: set[str] = set()  # layers sanitize converts without the other layers' tensors
        self._stand_ins = {n: mx.zeros(i.shape, DTYPES[i.dtype][1]) for n, i in resident.items()}
        self._stand_ins.update({n: _stand_in(i, 1) for n, i in candidates.items()})
        for group in by_layer.values():
            marked = {**self._stand_ins, **{n: _stand_in(i, 2) for n, i in group.items()}}
            try:
                out = self.sanitize(marked)
            except Exception:  # noqa: BLE001 - a stand-in sanitize cannot take: try the layer alone
                out = self._try_sanitize({n: _stand_in(i, 2) for n, i in group.items()})
            modules = {n.rsplit(".", 2)[0] for n, a in out.items() if a.shape[:1] == (2,)}
            modules &= containers.keys()
            if not modules:
                continue
            if len(modules) != 1:
                raise StreamerError(
                    f"{self.ckpt.folder}: cannot tell which MoE layer holds {sorted(group)}."
                )
            module = modules.pop()
            self.fused[module] = group
            alone = self._try_sanitize({n: _stand_in(i, 1) for n, i in group.items()})
            if any(n.startswith(module + ".") for n in alone):
                self._alone.add(module)

    def _refuse_unread(self, module: str, proj: str, kinds: set[str]) -> None:
        """Refuse a kind sanitize leaves unread in one expert's lazy stand-ins (`check_read`)."""
        infos = {k: next(iter(self.per_expert[(module, proj, k)].values())) for k in kinds}
        one = {f"expert.{k}": mx.zeros(i.shape, DTYPES[i.dtype][1]) for k, i in infos.items()}
        check_read(infos, {n.rsplit(".", 1)[1] for n in self._try_sanitize(one)}, KIND_ORDER)

    def _try_sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        try:
            return self.sanitize(weights)
        except Exception:  # noqa: BLE001 - sanitize may need tensors of other layers
            return {}

    def _fused_expert(self, module: str, expert: int) -> dict[str, mx.array]:
        """What sanitize makes of one expert's slice of `module`'s fused tensors (an expert axis of
        1), with the other layers' stand-ins alongside where sanitize needs them."""
        one = {}
        for name, info in self.fused[module].items():
            per = info.nbytes // self.num_experts
            data = self.ckpt.read(info, expert * per, per)
            one[name] = to_mlx(data, info.dtype, (1, *info.shape[1:]))
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
            out.update(self._fused_expert(module, expert))
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
            parent = f"{self.arch.hf_parent(module)}.{self.arch.hf_experts}"
            hf_name = next((h for h, m in self.arch.hf_projections.items() if m == proj), proj)
            raise StreamerError(
                f"{self.ckpt.folder}: tensor '{parent}.{expert}.{hf_name}.{kind}' (or "
                f"stacked '{module}.{proj}.{kind}') is missing: the download is incomplete."
            )
        return info


def _stand_in(info: TensorInfo, experts: int) -> mx.array:
    """A lazy tensor of `info`'s shape with `experts` on the first axis, never evaluated."""
    return mx.zeros((experts, *info.shape[1:]), DTYPES[info.dtype][1])


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


def _layer_prefix(name: str) -> str:
    """`model.layers.3` of `model.layers.3.mlp.experts.gate_up_proj`: up to the first number."""
    parts = name.split(".")
    number = next((i for i, p in enumerate(parts) if p.isdigit()), len(parts) - 1)
    return ".".join(parts[: number + 1])
