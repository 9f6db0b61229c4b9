"""A call routing more experts than the slot pool holds runs in rounds, expert-major
(experts/slots.py, `_rounds`): each routed expert read once per layer call, the logits exactly
the resident model's in every family, the CPU's way (each routed entry computed once) and a
GPU's (every entry each round, keeping the round's own: parts differ there in the last digit).
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import ARCHS, reference_model
from test_parity import PROMPT
from test_slots import gpu_way, slot_bytes

import streamer
from streamer.experts import slots as slot_calls


@pytest.fixture(scope="module")
def qwen3_float32(checkpoints):
    """qwen3_moe with float32 scales: computed on the pool itself, no per-call copy."""
    src = checkpoints.mlx("qwen3_moe", dtype="float32")
    return src, checkpoints.repacked(src)


@pytest.mark.parametrize("masked", [False, True])
def test_a_prompt_in_rounds_is_expert_major(qwen3_float32, monkeypatch, masked):
    """A prompt routing more experts than the pool's 4 slots: each routed expert read once per
    layer call, and the logits exactly the resident model's. The CPU's way computes each routed
    entry once (a round only its own experts' entries, on their tokens' rows); a GPU's
    (`masked`) every entry each round, the whole call's shape, keeping the round's own."""
    gpu_way(monkeypatch, masked)
    src, folder = qwen3_float32
    computed, distinct = [], []
    compute = slot_calls.Slots._compute
    rounds = slot_calls.Slots._rounds

    def counting_compute(self, layer, x, routed, *rest):
        computed.append(routed.size)
        return compute(self, layer, x, routed, *rest)

    def counting_rounds(self, layer, x, routed, experts, traffic):
        distinct.append((routed.size, len(experts)))
        return rounds(self, layer, x, routed, experts, traffic)

    monkeypatch.setattr(slot_calls.Slots, "_compute", counting_compute)
    monkeypatch.setattr(slot_calls.Slots, "_rounds", counting_rounds)
    model, tokenizer = streamer.load(
        folder, memory_budget=4 * slot_bytes(folder), read_path="slots"
    )
    prompt = mx.array(tokenizer.encode(PROMPT))[None]
    assert mx.array_equal(model(prompt), reference_model(src)(prompt))
    prefill = model.streamer.stats.prefill
    assert len(distinct) == prefill.layer_calls and all(n > 4 for _, n in distinct)  # in rounds
    assert all(entries == prompt.size * 4 for entries, _ in distinct)
    calls = sum(-(-n // 4) for _, n in distinct) if masked else len(distinct)  # rounds, or once
    assert sum(computed) == calls * prompt.size * 4
    assert prefill.experts_read + prefill.cache_hits == sum(n for _, n in distinct)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_family_in_rounds_matches_the_resident_model(checkpoints, arch, monkeypatch, masked):
    """A pool of 3 slots: every prompt call runs in rounds, each round's container computing only
    its own experts' entries on their tokens' rows or (`masked`, a GPU's way) every entry, keeping
    its own; whatever the family's expert container, the logits are the resident model's to the
    bit. Every call takes the synced path."""
    gpu_way(monkeypatch, masked)
    monkeypatch.setattr(slot_calls, "GATHERED_ROUTES", 0)
    src = checkpoints.mlx(arch, dtype="float32")
    folder = checkpoints.repacked(src)
    model, tokenizer = streamer.load(
        folder, memory_budget=3 * slot_bytes(folder), read_path="slots"
    )
    prompt = mx.array(tokenizer.encode(PROMPT))[None]
    assert mx.array_equal(model(prompt), reference_model(src)(prompt))
    assert model.streamer.stats.prefill.layer_calls > 0
