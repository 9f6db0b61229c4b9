"""The residency plan: what a model's MoE layers keep in memory, decided once per load from one
reading of the memory available (on a GPU the GPU's: backend.available_memory), and said in words
as `model.streamer.residency`.

Every layer runs resident (all experts fit the budget), or streams through a slot pool (the slot
read path: per shape class its slots, in pools of one chunk per group of layers), a hot-expert
cache or the page cache alone (the mapped read path). On CUDA the same reading's host memory
bounds what the slot pools' "pinned" and "gathered" landings page-lock (`pinnable`:
cache/landing.py). The loader applies the plan (pools.py, assembly.py); `streamer plan` makes the
same plan from a config's shapes (plan/report.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..cache.budget import default_budget, layer_bytes, layer_groups
from ..cache.expected_hits import PROFILES, expected_pool_hits
from ..cache.landing import CUDA_MISSES_DEFAULT
from ..cache.slot_memory import SlotTensor, chunk_slots
from ..cache.slot_pool import CHUNK_BYTES
from ..errors import refusal
from ..io.expert_layout import LayerLayout
from ..io.sizes import size_text
from .backend import Memory

# On CUDA, "pinned" and "gathered" page-lock whole expert files while they fit in this share of
# the host's memory available (past it a file is locked for each copy): cache/landing.py
PINNED_SHARE = 0.5
# Budget 0 asks for no expert cache. Where the pool's memory is the page cache's (Metal, the CPU,
# reads through the page cache) its slots are a few decode calls' experts: one layer's would hold
# copies of what the page cache has. Squeezed on this CPU, 32 slots read 0.96x in place's bytes
# from disk against one layer's 1.22-1.36x, at the same decode and prefill speed
# (bench/findings.md, "A smaller pool at budget 0"); larger calls run in rounds. On CUDA the pool
# is device memory: one layer's experts, so that a prompt chunk runs in one round (parts of a call
# are not bit-exact there).
SHARED_BUDGET_0_SLOTS = 32


@dataclass(frozen=True)
class LayerShape:
    """One MoE layer as the plan sees it."""

    index: int
    tensors: tuple  # its shape class: (name, dtype, one expert's shape) of each expert tensor
    experts: int
    slot_bytes: int  # one expert as stored: what a slot holds
    resident_bytes: int  # one expert in memory, floating tensors in the compute dtype


@dataclass(frozen=True)
class PoolGroup:
    layers: tuple[int, ...]  # consecutive layers sharing one pool
    slots: int
    chunks: int  # arrays per tensor (CHUNK_BYTES at most each)


@dataclass(frozen=True)
class ShapeClass:
    tensors: tuple  # LayerShape.tensors of its layers
    slot_bytes: int
    experts: int  # of all its layers
    groups: tuple[PoolGroup, ...]

    @property
    def slots(self) -> int:
        return sum(group.slots for group in self.groups)


@dataclass(frozen=True)
class ResidencyPlan:
    form: str  # "resident", "slot pool", "hot cache" or "page cache": every layer's
    read_path: str  # the load's (options.LoadOptions)
    read_path_why: str
    budget: int  # bytes of experts the plan may keep in memory
    budget_why: str  # the budget asked for, or the default and what it rests on
    memory: Memory  # the memory reading it was made from (backend.available_memory)
    expert_bytes: int  # every expert in memory (the "resident" form)
    largest_expert: int  # one expert in memory, the largest: a hot cache's slot
    classes: tuple[ShapeClass, ...] = ()  # the slot pool's, per shape class
    cache_slots: int = 0  # the hot cache's experts
    bypass_page_cache: bool = False  # the slot pool reads around the page cache
    chunk_bytes: int = CHUNK_BYTES  # the slot pool's arrays hold this many bytes at most
    cuda_misses: str = CUDA_MISSES_DEFAULT  # where a slot miss's bytes come from on CUDA
    shares_page_cache: bool = False  # the pool's memory is the page cache's: SHARED_BUDGET_0_SLOTS

    @property
    def pinnable(self) -> int:
        """Bytes of expert files CUDA's landing may lock whole: PINNED_SHARE of the host's
        memory available (the files are locked in host memory, not the GPU's)."""
        host = self.memory.host
        return int((self.memory.available if host is None else host) * PINNED_SHARE)

    @property
    def pool_bytes(self) -> int:
        return sum(c.slots * c.slot_bytes for c in self.classes)

    @property
    def expected_hits(self) -> dict[str, float]:
        """The slot pool's hit rate to expect, by routing profile (cache/expected_hits.py)."""
        share = 1.0 if self.form == "resident" else self.budget / self.expert_bytes
        return {p: expected_pool_hits(share, p) for p in PROFILES}

    def text(self) -> str:
        """The plan in words: model.streamer.residency, and what generate prints."""
        return f"{self._form_text()}; read path {self.read_path} ({self.read_path_why})"

    def _form_text(self) -> str:
        why = self.budget_why
        if self.form == "resident":
            return f"all experts resident, no streaming ({why})"
        if self.form == "page cache":
            return f"experts stream from disk, page cache only ({why})"
        if self.form == "hot cache":
            return (
                f"experts stream from disk; up to {self.cache_slots} hot experts kept in memory, "
                f"LFU with aging ({why})"
            )
        kind = "LFU with aging"
        if self.budget == 0:
            kind = "a few calls' experts" if self.shares_page_cache else "one layer's experts"
        if self.bypass_page_cache:
            kind += ", read around the page cache"
        chunks = sum(group.chunks for c in self.classes for group in c.groups)
        if chunks > 1:
            kind += f", {chunks} chunks"
        sizes = ", ".join(str(c.slots) for c in self.classes)
        return (
            f"experts stream from disk into a slot pool of {sizes} slots "
            f"({size_text(self.pool_bytes)}, {kind}; {why})"
        )


def layer_shapes(layers: Sequence, layouts: Sequence[LayerLayout], dtype) -> list[LayerShape]:
    """A loaded model's layers (a manifest's or a download's, with their layouts) as the plan
    sees them, in the compute dtype `dtype`."""
    return [
        LayerShape(
            index=layout.index,
            tensors=shape_class(layout),
            experts=layout.num_experts,
            slot_bytes=sum(t.at.length for t in layout.tensors),
            resident_bytes=layer_bytes(layer, dtype) // layer.num_experts,
        )
        for layer, layout in zip(layers, layouts)
    ]


def shape_class(layout: LayerLayout) -> tuple:
    """What layers sharing a pool have in common: (name, dtype, shape) of each expert tensor."""
    return tuple((t.name, t.dtype, t.shape) for t in layout.tensors)


def plan_residency(
    shapes: Sequence[LayerShape],
    budget: int | None,
    read_path: str,
    read_path_why: str,
    memory: Memory,
    bypass_page_cache: bool = False,
    cuda_misses: str = CUDA_MISSES_DEFAULT,
) -> ResidencyPlan:
    """The plan for `budget` bytes of experts (None: the read path's default in `memory`).
    Enough for every expert: all resident. Less: the slot path's pool (slot_classes); the mapped
    path's hot cache of the largest expert's slots, or (0) the page cache alone. A slot pool
    takes its memory from the page cache's where `memory` is the host's (every backend but
    CUDA: backend.available_memory says)."""
    need = sum(s.experts * s.resident_bytes for s in shapes)
    largest = max(s.resident_bytes for s in shapes)
    if budget is None:
        budget, why = default_budget(need, largest, memory.available, read_path, memory.name)
    else:
        why = f"memory budget {size_text(budget)}"
    plan = ResidencyPlan(
        form="resident",
        read_path=read_path,
        read_path_why=read_path_why,
        budget=budget,
        budget_why=why,
        memory=memory,
        expert_bytes=need,
        largest_expert=largest,
        bypass_page_cache=bypass_page_cache,
        cuda_misses=cuda_misses,
        shares_page_cache=memory.host is None and not bypass_page_cache,
    )
    if budget >= need:
        return plan
    if read_path == "slots":
        cap = SHARED_BUDGET_0_SLOTS if plan.shares_page_cache else None
        classes = slot_classes(shapes, budget, CHUNK_BYTES, cap)
        return replace(plan, form="slot pool", classes=classes, chunk_bytes=CHUNK_BYTES)
    if budget == 0:
        return replace(plan, form="page cache")
    return replace(plan, form="hot cache", cache_slots=budget // max(largest, 1))


def slot_classes(
    shapes: Sequence[LayerShape], budget: int, chunk_bytes: int, cap: int | None = None
) -> tuple[ShapeClass, ...]:
    """Per shape class its share of `budget` in proportion to the class's experts, at least one
    slot; 0: one layer's experts each (the smallest pool in which any call, a whole prompt chunk
    too, runs in one round), or `cap` slots if fewer. Past 0, pools of one chunk per group of
    layers (layer_groups)."""
    members: dict[tuple, list[LayerShape]] = {}
    for shape in shapes:
        members.setdefault(shape.tensors, []).append(shape)
    total = sum(s.experts * s.slot_bytes for s in shapes)
    classes = []
    for key, layers in members.items():
        experts = sum(s.experts for s in layers)
        most = min(max(s.experts for s in layers), cap or experts)
        slots = min(experts, max(1, budget * experts // total) if budget else most)
        per_chunk = chunk_slots([SlotTensor(*t) for t in key], slots, chunk_bytes)
        groups = layer_groups(len(layers), slots, per_chunk if budget else slots)
        pools = tuple(
            PoolGroup(tuple(s.index for s in layers[a:b]), n, math.ceil(n / per_chunk))
            for a, b, n in groups
        )
        classes.append(ShapeClass(key, layers[0].slot_bytes, experts, pools))
    return tuple(classes)


def check_fits(plan: ResidencyPlan) -> None:
    """Experts kept in memory (every one resident, a budget past them all; a slot pool; a hot
    cache, full) that do not fit in the memory available (on a GPU the GPU's: backend.py) are
    refused before any expert is read."""
    held, what = {
        "resident": (plan.expert_bytes, "every expert in memory"),
        "slot pool": (plan.pool_bytes, "a slot pool"),
        "hot cache": (plan.cache_slots * plan.largest_expert, "a hot-expert cache"),
    }.get(plan.form, (0, ""))
    memory = plan.memory
    if held > memory.available:
        raise refusal(
            lambda spell: (
                f"{what}, {size_text(held)} ({plan.budget_why}), does not fit in the "
                f"{size_text(memory.available)} of {memory.name} available: {_instead(plan, spell)}"
            )
        )


def _instead(plan: ResidencyPlan, spell) -> str:
    """What to do instead. Budget 0's pool is the smallest: free that memory or, where it is the
    host's, compute in place (the mapped path: CUDA has none)."""
    if plan.budget:
        return "give a smaller memory budget."
    smallest = f"it is budget 0's, the smallest; free {plan.memory.name}"
    if plan.memory.host is not None:
        return smallest + "."
    return f"{smallest}, or read with {spell('read_path', 'mapped')} (budget 0 there keeps none)."
