"""Hot experts kept in memory within a byte budget, chosen by LFU with aging.

Replaying routing traces, least-recently-used collapses when one token's working set (layers x
top-k) exceeds the slots, since each token then evicts what the next one needs; LFU with aging
keeps the popular experts (bench/replay_policies.py). Cached experts are stored in the compute
dtype.
"""

from __future__ import annotations

import mlx.core as mx

from .policies import LFUAging


class HotExperts:
    def __init__(self, budget_bytes: int, slot_bytes: int, policy=LFUAging):
        """`slot_bytes`: what one cached expert may take (the largest expert, resident);
        `policy`: a cache/policies.py class taking the number of slots."""
        self.slots = budget_bytes // max(slot_bytes, 1)
        self._policy = policy(self.slots)
        self._experts: dict[tuple[int, int], list[mx.array]] = {}
        # admitted by the policy, not yet `put`: a layer call admits all its misses first, and a
        # later miss of the same call may evict an earlier one before it is put
        self._admitted: set[tuple[int, int]] = set()

    def access(self, layer: int, expert: int) -> tuple[list[mx.array] | None, bool]:
        """(the cached tensors or None, whether the caller should `put` this miss)."""
        key = (layer, expert)
        hit, admitted, evicted = self._policy.access(key)
        if evicted is not None:
            self._experts.pop(evicted, None)
            self._admitted.discard(evicted)
        if hit and key not in self._experts:  # admitted but never put (its call failed)
            hit, admitted = False, True
        if admitted:
            self._admitted.add(key)
        return (self._experts[key] if hit else None), admitted

    def put(self, layer: int, expert: int, tensors: list[mx.array]) -> None:
        """Keep a miss `access` admitted, unless a later miss has evicted it since."""
        key = (layer, expert)
        if key in self._admitted:
            self._admitted.discard(key)
            self._experts[key] = tensors

    def __len__(self) -> int:
        return len(self._experts)
