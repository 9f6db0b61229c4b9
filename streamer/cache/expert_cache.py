"""Hot experts kept in memory within a byte budget, chosen by LFU with aging.

Replaying routing traces, least-recently-used collapses when one token's working set (layers x
top-k) exceeds the slots, since each token then evicts what the next one needs; LFU with aging
keeps the popular experts (bench/replay_policies.py). Cached experts are stored in the compute
dtype.
"""

from __future__ import annotations

import mlx.core as mx

from .policies import LFUAging


class ExpertCache:
    def __init__(self, budget_bytes: int, slot_bytes: int):
        """`slot_bytes`: what one cached expert may take (the largest expert, resident)."""
        self.slots = budget_bytes // max(slot_bytes, 1)
        self._policy = LFUAging(self.slots)
        self._experts: dict[tuple[int, int], list[mx.array]] = {}

    def access(self, layer: int, expert: int) -> tuple[list[mx.array] | None, bool]:
        """(the cached tensors or None, whether the caller should `put` this miss)."""
        hit, admitted, evicted = self._policy.access((layer, expert))
        if evicted is not None:
            del self._experts[evicted]
        return (self._experts[(layer, expert)] if hit else None), admitted

    def put(self, layer: int, expert: int, tensors: list[mx.array]) -> None:
        self._experts[(layer, expert)] = tensors
