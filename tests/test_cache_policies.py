"""Expert-cache policies and routing traces."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import streamer
from streamer.cache.policies import LRU, LFUAging


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
