"""Expert-cache policies and routing traces."""

from __future__ import annotations

import subprocess
import sys

import mlx.core as mx
import numpy as np

import streamer
from streamer.cache.policies import LRU, LFUAging, SlotLFU, SlotLRU


def hits(policy, keys) -> int:
    return sum(policy.access(k)[0] for k in keys)


def test_lru_keeps_the_most_recent():
    lru = LRU(2)
    assert hits(lru, ["a", "b", "a", "c", "a", "b"]) == 2  # a hit twice; b was evicted by c
    assert lru.access("a") == (True, False, None)
    assert lru.access("c") == (False, True, "b")  # c comes back, evicting the least recent


def test_lfu_aging_keeps_hot_experts_through_a_scan():
    hot = ["h1", "h2"] * 20
    scan = [f"cold{i}" for i in range(50)]
    lru, lfu = LRU(2), LFUAging(2)
    hits(lru, hot + scan)
    hits(lfu, hot + scan)
    assert hits(lfu, ["h1", "h2"]) == 2  # one-off experts could not displace the hot pair
    assert hits(lru, ["h1", "h2"]) == 0


def test_lfu_aging_forgets_old_popularity():
    lfu = LFUAging(1, half_life=8)
    hits(lfu, ["old"] * 6)
    hits(lfu, ["new"] * 40)
    assert lfu.access("new")[0]


def test_decode_routing_trace_and_replay(checkpoints, tmp_path):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("olmoe")), memory_budget=0)
    model.streamer.stats.trace = []
    streamer.generate(model, tokenizer, "The value of the", max_tokens=12)
    trace = model.streamer.stats.trace
    assert len(trace) == 2 * model.streamer.stats.decode_tokens
    assert all(len(set(experts)) == len(experts) <= 4 for _, experts in trace)
    # replay it: tokens x layers x top-k
    experts = np.array([list(e) for _, e in trace]).reshape(-1, 2, 4)
    np.savez(tmp_path / "trace.npz", experts=experts, num_experts=16)
    out = subprocess.run(
        [sys.executable, "bench/replay_policies.py", str(tmp_path / "trace.npz"), "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    import json

    rows = json.loads(out)["rows"]
    assert [r["budget_fraction"] for r in rows] == [0.05, 0.1, 0.25, 0.5]
    assert all(0 <= r[p] <= 1 for r in rows for p in ("lru", "lfu-aging", "static-layers"))


def test_a_miss_evicted_by_a_later_miss_of_the_same_call():
    """A layer call asks about all its experts before it puts the misses: an earlier admitted
    miss may be evicted by a later one before it is put."""
    from streamer.cache.hot_experts import HotExperts

    cache = HotExperts(budget_bytes=1, slot_bytes=1, policy=LRU)  # one slot
    assert cache.access(0, 1) == (None, True)
    assert cache.access(0, 2) == (None, True)  # evicts expert 1, not yet put
    cache.put(0, 1, ["one"])  # evicted meanwhile: not kept
    cache.put(0, 2, ["two"])
    assert len(cache) == 1 and cache.access(0, 2) == (["two"], False)
    assert cache.access(0, 1) == (None, True)  # a miss again, not a KeyError


def test_hot_cache_with_a_tiny_budget_and_many_experts_per_call(checkpoints):
    """Prefill routes many experts per layer call through a cache of two slots, on each policy;
    the text is the streamed model's (memory_budget=0) on every one."""
    from streamer.cache.budget import largest_expert_bytes
    from streamer.cache.hot_experts import HotExperts

    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    prompt = "The function returns the value of the argument, or raises an error " * 3
    model, tokenizer = streamer.load(folder, memory_budget=0)
    expected = streamer.generate(model, tokenizer, prompt, max_tokens=6)
    for policy in (LRU, LFUAging):
        model, tokenizer = streamer.load(folder, memory_budget=0)
        handle = model.streamer
        slot = largest_expert_bytes(handle.manifest, mx.float32)
        cache = HotExperts(2 * slot, slot, policy=policy)
        for layer in handle.layers:
            layer.use_cache(cache)
        assert streamer.generate(model, tokenizer, prompt, max_tokens=6) == expected, policy
        assert len(cache) <= 2


def test_slot_lru_evicts_the_oldest_call_and_never_the_current_one():
    policy = SlotLRU(slots=3, keys=10)
    slots, miss = policy.assign(np.array([0, 1, 2]))
    assert miss.all() and sorted(slots) == [0, 1, 2]
    policy.assign(np.array([2]))
    policy.assign(np.array([0]))  # 1 is now the least recently used
    again, miss = policy.assign(np.array([0, 3]))
    assert list(miss) == [False, True] and again[1] == slots[1] and policy.slot_of[1] == -1
    # a call as large as the pool takes every slot but evicts none of its own keys
    keys = np.array([3, 4, 5])
    placed, miss = policy.assign(keys)
    assert sorted(placed) == [0, 1, 2] and list(policy.slot_key[placed]) == list(keys)


def test_slot_lru_and_lfu_part_on_a_scan():
    """One-off keys flush LRU's hot pair; LFU with aging keeps it (bench/routing_model.py replays
    both on the routing profiles)."""
    lru, lfu = SlotLRU(slots=3, keys=100), SlotLFU(slots=3, keys=100)
    for policy in (lru, lfu):
        for _ in range(20):
            policy.assign(np.array([0, 1]))
        for cold in range(2, 40):
            policy.assign(np.array([cold]))
    assert lru.assign(np.array([0, 1]))[1].all()
    assert not lfu.assign(np.array([0, 1]))[1].any()


def test_a_refresh_gives_slots_to_keys_routed_more_often_than_those_they_displace():
    """SlotLFU.refresh (a gathered settle's): the empty slots go to the hottest keys first; a held
    key is displaced only by one routed more than `margin` times more often (by default 0: more
    often at all); counts age as `assign`'s do."""
    policy = SlotLFU(slots=3, keys=100, half_life=64)
    policy.refresh([np.array([5, 6, 7]), np.array([6, 7]), np.array([7, 8])])
    assert sorted(np.flatnonzero(policy.slot_of >= 0)) == [5, 6, 7]  # 8 is as cold as 5: out
    before = policy.slot_key.copy()
    policy.refresh([np.array([8])], margin=1)  # 8 routed twice in all, 5 once: not 1 more
    assert np.array_equal(policy.slot_key, before)
    policy.refresh([np.array([9])])  # 9 once, as often as 5: no move
    assert np.array_equal(policy.slot_key, before)
    policy.refresh([np.array([9])])  # 9 twice now, more often than 5: it takes 5's slot
    assert policy.slot_key[policy.slot_of[9]] == 9 and policy.slot_of[5] == -1
    assert sorted(policy.slot_key) == [6, 7, 9]
    assert sorted(policy.slot_of[[6, 7]]) == sorted(np.flatnonzero(np.isin(before, [6, 7])))
    policy.refresh([np.array([8])])  # 8 (3) beats the coldest held (6 or 9: 2), not 7 (3)
    assert policy.slot_of[8] >= 0 and policy.slot_of[7] >= 0 and len(set(policy.slot_key)) == 3
    once = SlotLFU(slots=3, keys=100, half_life=64)
    calls = [np.array([k % 10, 10 + k % 7]) for k in range(50)]  # past a halving: counts age
    once.refresh(calls)
    by_calls = SlotLFU(slots=3, keys=100, half_life=64)
    for keys in calls:
        by_calls.assign(keys)
    assert np.allclose(once.counts, by_calls.counts)
    policy.refresh([])  # nothing to count or move
