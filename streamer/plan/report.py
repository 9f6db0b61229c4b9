"""What `streamer plan` reports, and the two numbers it derives: the longest context that fits
beside the resident weights, and whether the model runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from ..cache.budget import SLOT_SHARE
from ..cache.expected_hits import TYPICAL
from ..io.sizes import size_text
from ..loading.backend import Memory
from ..loading.residency import LayerShape, ResidencyPlan, plan_residency

MIN_CONTEXT = 4096  # "runs": the resident weights plus this much context fit


@dataclass
class ModelPlan:
    model_type: str
    moe_layers: int
    experts: int
    experts_per_token: int
    disk_bytes: int  # the repacked folder
    delete_source_peak_bytes: int | None  # repack --delete-source's peak beyond the download
    download_bytes: int | None  # the checkpoint's tensors (its own shards only), when there
    resident_bytes: int  # non-expert weights, in memory, in the compute dtype
    expert_bytes: int  # on disk as repacked: a page-aligned record per expert
    expert_bytes_per_token: int  # read per token when no expert is cached, as repacked
    kv_bytes_per_1k_tokens: int
    kv_fixed_bytes: int  # state that does not grow (linear attention, sliding windows)
    context_length: int | None  # max_position_embeddings (DBRX: max_seq_len)
    memory_bytes: int
    longest_context: int  # tokens of KV cache that fit beside the resident weights
    runs: bool
    slot_budget_bytes: int  # the slot path's default budget (Metal, CUDA) in `memory_bytes`
    slot_pool_hits: dict[str, float]  # routed experts to expect from that pool, by routing
    mapped_budget_bytes: int  # the mapped path's default (the CPU): all experts, or 0
    expert_memory_bytes: int  # every expert in memory, in the compute dtype (the residency's)
    kv_bits: int | None = None  # mlx-lm's quantized KV cache, counted from the first token
    in_place_ranges: int | None = None  # byte ranges per expert in a download streamed in place
    in_place_expert_bytes: int | None = None  # the experts' tensors in that download
    in_place_bytes_per_token: int | None = None  # read per token with no hits, in place
    # a load's residency plan (loading/residency.py) for each read path, in what is left of
    # `memory_bytes` beside the resident weights: the same plan `model.streamer.plan` holds
    plans: dict[str, ResidencyPlan] = field(default_factory=dict, repr=False)

    def lines(self) -> list[str]:
        gb = size_text
        lines = [
            f"model_type         {self.model_type}",
            f"experts            {self.experts} per layer in {self.moe_layers} MoE layers, "
            f"{self.experts_per_token} routed per token",
        ]
        if self.download_bytes is not None:
            lines.append(f"download           {gb(self.download_bytes)} (safetensors)")
        if self.in_place_ranges:
            lines.append(f"in place           {self.in_place_line()}")
        lines += [
            f"repack disk        {gb(self.disk_bytes)}"
            + (
                f" ({gb(self.delete_source_peak_bytes)} at most with --delete-source)"
                if self.delete_source_peak_bytes is not None
                else ""
            ),
            f"resident           {gb(self.resident_bytes)} (non-expert weights, in memory)",
            f"experts            {self.experts_line()}",
            f"read per token     {gb(self.expert_bytes_per_token)} repacked"
            + (f", {gb(self.in_place_bytes_per_token)} in place" if self.in_place_ranges else "")
            + ": the experts read with no cache hits",
            f"KV cache           {gb(self.kv_bytes_per_1k_tokens)} per 1k tokens"
            + (f" at {self.kv_bits} bits" if self.kv_bits else "")
            + (f" (+ {gb(self.kv_fixed_bytes)} fixed)" if self.kv_fixed_bytes else ""),
            f"longest context    {self.longest_context} tokens in {gb(self.memory_bytes)}"
            + (f" (the model's limit is {self.context_length})" if self.context_length else ""),
            f"runs               {'yes' if self.runs else 'no'}: "
            + (
                f"{gb(self.resident_bytes)} resident + KV of {self.min_context} tokens "
                f"{'fit' if self.runs else 'do not fit'} in {gb(self.memory_bytes)}"
            ),
            f"budget (GPU)       {self.slot_budget_line()}",
            "budget (CPU)       "
            + (
                "all experts in memory (they fit in half of what is left)"
                if self.mapped_budget_bytes
                else "0: experts computed in place from the page cache"
            ),
        ]
        return lines + [
            f"{f'residency ({path})':<19}{plan.text()}" for path, plan in self.plans.items()
        ]

    def experts_line(self) -> str:
        """The experts' bytes on disk in each layout planned, and in memory, the figure the
        residency lines count: a repacked record is page-padded; in memory an expert is its
        tensors alone, floating ones in the compute dtype."""
        on_disk = f"{size_text(self.expert_bytes)} on disk repacked (a page-aligned record each)"
        if self.in_place_ranges:
            on_disk += f", {size_text(self.in_place_expert_bytes)} in place"
        return f"{on_disk}; {size_text(self.expert_memory_bytes)} in memory where resident"

    def in_place_line(self) -> str:
        """What streaming the download without a repack costs, measured (bench/findings.md, "The
        host's work per layer call"): nothing on the slot path; on the mapped path a residency
        check per range in each synced layer call."""
        n = self.in_place_ranges
        return (
            f"yes, {n} ranges an expert: as fast as a repack on the slot path (Metal, CUDA); "
            f"+0.18 ms a synced layer call on the mapped path (CPU; a repack reads 1)"
        )

    def slot_budget_line(self) -> str:
        """The slot path's default budget (Metal and CUDA) and the pool hits it should get."""
        plan = self.plans["slots"]
        if plan.form == "resident":
            return f"all {size_text(plan.expert_bytes)} of experts in memory, no reads"
        hits = ", ".join(f"{p} {h:.0%}" for p, h in self.slot_pool_hits.items())
        return (
            f"{size_text(plan.budget)} slot pool ({SLOT_SHARE:.0%} of the "
            f"{size_text(plan.memory.available)} left, "
            f"{plan.budget / plan.expert_bytes:.0%} of the experts): "
            f"about {self.slot_pool_hits[TYPICAL]:.0%} pool hits on typical routing "
            f"({hits}; bench/routing_model.py's profiles)"
        )

    @property
    def min_context(self) -> int:
        return min(MIN_CONTEXT, self.context_length or MIN_CONTEXT)

    def json(self) -> str:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "plans"}
        return json.dumps(values, indent=2)


def fitted(
    *,
    kv_per_token: int,
    kv_fixed: int,
    context: int | None,
    memory: int,
    shapes: Sequence[LayerShape],
    **fields,
) -> ModelPlan:
    """The plan, with the longest context that fits in `memory` beside the resident weights,
    whether the model runs (resident weights plus MIN_CONTEXT tokens, or the model's whole
    context if shorter, fit) and each read path's residency plan for the MoE layers `shapes` in
    what the resident weights leave of `memory` (as a load reads the memory available once they
    are loaded: loading/residency.py)."""
    resident = fields["resident_bytes"]
    room = memory - resident - kv_fixed
    longest = max(0, room // kv_per_token) if kv_per_token else (context or 0)
    if context:
        longest = min(longest, context)
    need = resident + kv_fixed + kv_per_token * min(MIN_CONTEXT, context or MIN_CONTEXT)
    left = max(memory - resident, 0)
    plans = {
        path: plan_residency(shapes, None, path, f"the {where} default", Memory(left))
        for path, where in (("slots", "Metal and CUDA"), ("mapped", "CPU"))
    }
    slots, mapped = plans["slots"], plans["mapped"]
    if fields.get("in_place_ranges"):  # an expert's tensors as the download stores them
        fields["in_place_expert_bytes"] = sum(s.slot_bytes * s.experts for s in shapes)
        per_token = sum(s.slot_bytes for s in shapes) * fields["experts_per_token"]
        fields["in_place_bytes_per_token"] = per_token
    return ModelPlan(
        **fields,
        expert_memory_bytes=slots.expert_bytes,
        slot_budget_bytes=slots.budget,
        slot_pool_hits=slots.expected_hits,
        mapped_budget_bytes=mapped.budget,
        kv_bytes_per_1k_tokens=kv_per_token * 1000,
        kv_fixed_bytes=kv_fixed,
        context_length=context,
        memory_bytes=memory,
        longest_context=int(longest),
        runs=need <= memory,
        plans=plans,
    )
