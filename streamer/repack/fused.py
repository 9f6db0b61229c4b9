"""Fused expert tensors (a whole layer's experts in a layout of the family's own), found by asking
mlx-lm's sanitize about lazy stand-ins of the source tensors that are never evaluated; and the
stand-in that sizes a converted expert from its headers alone (records.layer_bytes)."""

from __future__ import annotations

import mlx.core as mx

from ..errors import StreamerError
from ..io.safetensors import DTYPES, TensorInfo
from .layouts import Sanitize

Fused = dict[str, dict[str, TensorInfo]]  # expert container -> its layer's fused tensors


def find_fused(
    folder, sanitize: Sanitize, candidates: dict[str, TensorInfo], resident: dict, containers: dict
) -> tuple[Fused, set[str], dict[str, mx.array]]:
    """Which expert container each layer's fused tensors feed. Sanitize is asked about
    stand-ins that are never evaluated: the candidates of one layer with an expert axis of 2,
    the other candidates with 1 and the resident tensors as they are (sanitize may read any
    of them): the container tensors with 2 experts come from that layer. Candidates that feed
    none (a router, multi-token prediction layers) are not experts. Returns the fused tensors,
    the layers sanitize converts without the other layers' tensors, and the stand-ins of all."""
    by_layer: dict[str, dict[str, TensorInfo]] = {}
    for name, info in candidates.items():
        by_layer.setdefault(_layer_prefix(name), {})[name] = info
    fused: Fused = {}
    alone: set[str] = set()
    stand_ins = {n: mx.zeros(i.shape, DTYPES[i.dtype][1]) for n, i in resident.items()}
    stand_ins.update({n: _stand_in(i, 1) for n, i in candidates.items()})
    for group in by_layer.values():
        marked = {**stand_ins, **{n: _stand_in(i, 2) for n, i in group.items()}}
        try:
            out = sanitize(marked)
        except Exception:  # noqa: BLE001 - a stand-in sanitize cannot take: try the layer alone
            out = try_sanitize(sanitize, {n: _stand_in(i, 2) for n, i in group.items()})
        modules = {n.rsplit(".", 2)[0] for n, a in out.items() if a.shape[:1] == (2,)}
        modules &= containers.keys()
        if not modules:
            continue
        if len(modules) != 1:
            raise StreamerError(f"{folder}: cannot tell which MoE layer holds {sorted(group)}.")
        module = modules.pop()
        fused[module] = group
        one = try_sanitize(sanitize, {n: _stand_in(i, 1) for n, i in group.items()})
        if any(n.startswith(module + ".") for n in one):
            alone.add(module)
    return fused, alone, stand_ins


def header_array(info: TensorInfo, shape: tuple[int, ...], start: int) -> mx.array:
    """A lazy stand-in for Sources' read of `shape` from tensor `info`, never evaluated: nothing
    is read (its dtype and shape are the read array's)."""
    return mx.zeros(shape, DTYPES[info.dtype][1])


def try_sanitize(sanitize: Sanitize, weights: dict[str, mx.array]) -> dict[str, mx.array]:
    try:
        return sanitize(weights)
    except Exception:  # noqa: BLE001 - sanitize may need tensors of other layers
        return {}


def _stand_in(info: TensorInfo, experts: int) -> mx.array:
    """A lazy tensor of `info`'s shape with `experts` on the first axis, never evaluated."""
    return mx.zeros((experts, *info.shape[1:]), DTYPES[info.dtype][1])


def _layer_prefix(name: str) -> str:
    """`model.layers.3` of `model.layers.3.mlp.experts.gate_up_proj`: up to the first number."""
    parts = name.split(".")
    number = next((i for i, p in enumerate(parts) if p.isdigit()), len(parts) - 1)
    return ".".join(parts[: number + 1])
