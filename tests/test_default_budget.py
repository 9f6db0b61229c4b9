"""The default memory budget by read path, and what `streamer plan` says it will choose."""

from __future__ import annotations

import json
from dataclasses import replace

import mlx.core as mx

import streamer
from streamer.cache.budget import (
    SLOT_SHARE,
    all_experts_bytes,
    default_budget,
    largest_expert_bytes,
    slot_default,
)
from streamer.cache.expected_hits import PROFILES, expected_pool_hits
from streamer.cli import main
from streamer.io.manifest import read_manifest
from streamer.loading import load as loading
from streamer.loading.backend import Memory
from streamer.loading.residency import SHARED_BUDGET_0_SLOTS, LayerShape, plan_residency
from streamer.plan import plan


def test_the_slot_default_is_a_share_of_what_is_available():
    assert slot_default(10, 1, 100) == 10  # all experts fit: all of them
    assert slot_default(1000, 1, 100) == int(100 * SLOT_SHARE)
    assert slot_default(1000, 7, 4) == 7  # never below one expert


def test_expected_hits_grow_with_the_budget():
    for profile in PROFILES:
        hits = [expected_pool_hits(f / 20, profile) for f in range(21)]
        assert hits[0] == 0 and hits[-1] == 1 and expected_pool_hits(2.0, profile) == 1
        assert all(a <= b for a, b in zip(hits, hits[1:])) and 0 < hits[10] < 1


def _available(monkeypatch, nbytes: int) -> list:
    """The one memory reading a load's plan is made from, faked; its calls are counted."""
    calls = []
    monkeypatch.setattr(loading, "available_memory", lambda: calls.append(1) or Memory(nbytes))
    return calls


def test_default_budget_by_read_path(checkpoints):
    manifest = read_manifest(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    need = all_experts_bytes(manifest, None)
    one = largest_expert_bytes(manifest, None)
    # all of them would fit, but not in the slot path's share
    budget, why = default_budget(need, one, need, "slots")
    assert budget == int(need * SLOT_SHARE) and budget > one
    assert f"expect about {expected_pool_hits(budget / need):.0%} pool hits on typical" in why
    assert f"(high {expected_pool_hits(budget / need, 'high'):.0%}, medium" in why
    assert default_budget(need, one, need, "mapped")[0] == 0  # not in half: the page cache
    assert default_budget(need, one, 2 * need, "slots")[0] == need
    assert default_budget(need, one, 2 * need, "mapped")[0] == need


def test_a_slot_load_takes_the_default(checkpoints, monkeypatch):
    dst = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    need = all_experts_bytes(read_manifest(dst), mx.float32)
    calls = _available(monkeypatch, need)
    model, _ = streamer.load(dst, read_path="slots", dtype=mx.float32)
    assert calls == [1]  # one reading of memory, for every choice the plan makes
    pools = model.streamer.pools
    assert pools and sum(p.nbytes for p in pools) <= need * SLOT_SHARE
    plan = model.streamer.plan
    assert plan.form == "slot pool" and plan.memory.available == need
    assert plan.pool_bytes == sum(p.nbytes for p in pools)
    assert "pool hits" in model.streamer.residency
    model.streamer.close()


def test_plan_says_the_default_budget_and_its_hits(checkpoints, capsys):
    dst = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    roomy = plan(dst, 1 << 34)
    assert roomy.slot_budget_bytes == roomy.expert_bytes
    assert roomy.slot_pool_hits == dict.fromkeys(PROFILES, 1.0)  # nothing is read
    assert roomy.mapped_budget_bytes == roomy.expert_bytes
    memory = roomy.resident_bytes + roomy.expert_bytes  # the experts fit, not in the share
    tight = plan(dst, memory)
    assert tight.slot_budget_bytes == int(roomy.expert_bytes * SLOT_SHARE)
    assert tight.slot_pool_hits == {p: expected_pool_hits(SLOT_SHARE, p) for p in PROFILES}
    assert tight.mapped_budget_bytes == 0
    # more locality, more hits: Qwen3-30B-A3B-like routing above routing with none
    hits = [tight.slot_pool_hits[p] for p in PROFILES]
    assert hits == sorted(hits, reverse=True) and hits[0] > hits[-1]
    cli = plan(dst, memory, dtype=mx.float32)  # the command's compute dtype on this CPU
    assert main(["plan", str(dst), "--memory", str(memory)]) == 0
    text = capsys.readouterr().out
    assert f"slot pool ({SLOT_SHARE:.0%} of the" in text
    assert f"about {cli.slot_pool_hits['medium']:.0%} pool hits on typical routing" in text
    by_routing = ", ".join(f"{p} {h:.0%}" for p, h in cli.slot_pool_hits.items())
    assert f"({by_routing}; bench/routing_model.py's profiles)" in text
    assert json.loads(cli.json())["slot_pool_hits"] == cli.slot_pool_hits
    assert "budget (CPU)       0: experts computed in place" in text
    assert main(["plan", str(dst), "--memory", str(memory), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slot_budget_bytes"] == cli.slot_budget_bytes


def test_budget_0_is_a_few_calls_experts_where_the_pool_shares_the_page_caches_memory():
    """Budget 0 on the slot path: on Metal and the CPU (reads through the page cache) a pool of
    SHARED_BUDGET_0_SLOTS, shared by every layer; on CUDA (device memory) or when the pool reads
    around the page cache (it is then the only cache), one layer's experts; a layer with fewer
    experts than that, all of them. Which memory the pool takes is the memory reading's to say
    (a CUDA reading's host figure): the plan asked the backend again, so a CUDA reading planned on
    another backend shared the page cache's memory that the reading said the pool is not in."""
    tensors = (("gate_proj.weight", mx.uint32, (768, 256)),)
    shapes = [LayerShape(i, tensors, 128, 786_432, 786_432) for i in range(4)]
    host = Memory(1 << 40)  # the CPU's, or Metal's unified memory
    gpu = Memory(1 << 40, "GPU memory", host=1 << 40)  # CUDA's, as backend.available_memory reads

    def pool(memory: Memory, experts: int = 128, **kw) -> tuple[int, str]:
        layers = [replace(s, experts=experts) for s in shapes]
        plan = plan_residency(layers, 0, "slots", "asked", memory, **kw)
        assert [len(g.layers) for c in plan.classes for g in c.groups] == [4]  # one pool
        return plan.classes[0].slots, plan.text()

    slots, text = pool(host)
    assert slots == SHARED_BUDGET_0_SLOTS == 32 and "a few calls' experts" in text
    slots, text = pool(gpu)
    assert slots == 128 and "one layer's experts" in text
    assert pool(host, bypass_page_cache=True)[0] == 128
    assert pool(host, experts=16)[0] == 16
