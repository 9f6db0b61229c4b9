"""Eviction policies for a budget of expert slots, keyed by (layer, expert).

`access(key)` returns (hit, admitted, evicted): whether the key was cached, whether a miss was
taken in, and which key it displaced. They choose what the engine's expert cache keeps and replay
routing traces (bench/replay_policies.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

Outcome = tuple[bool, bool, "Hashable | None"]


class LRU:
    """Least recently used: the floor every other policy must beat."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, None] = OrderedDict()

    def access(self, key: Hashable) -> Outcome:
        if key in self._entries:
            self._entries.move_to_end(key)
            return True, False, None
        if self.capacity <= 0:
            return False, False, None
        self._entries[key] = None
        evicted = (
            self._entries.popitem(last=False)[0] if len(self._entries) > self.capacity else None
        )
        return False, True, evicted


class LFUAging:
    """Least frequently used, with counts halved every `half_life` accesses so old popularity fades.

    Frequencies are kept for every key seen, cached or not, and a miss only displaces the coldest
    cached key if it has been used more often: one-off experts cannot flush the hot set.
    """

    def __init__(self, capacity: int, half_life: int = 4096):
        self.capacity = capacity
        self.half_life = half_life
        self._counts: dict[Hashable, float] = {}
        self._cached: set[Hashable] = set()
        self._accesses = 0

    def access(self, key: Hashable) -> Outcome:
        self._accesses += 1
        if self._accesses % self.half_life == 0:
            self._counts = {
                k: c / 2 for k, c in self._counts.items() if c >= 0.25 or k in self._cached
            }
        self._counts[key] = self._counts.get(key, 0.0) + 1.0
        if key in self._cached:
            return True, False, None
        if len(self._cached) < self.capacity:
            self._cached.add(key)
            return False, True, None
        if self.capacity > 0:
            coldest = min(self._cached, key=self._counts.__getitem__)
            if self._counts[coldest] < self._counts[key]:
                self._cached.remove(coldest)
                self._cached.add(key)
                return False, True, coldest
        return False, False, None


class StaticLayers:
    """Whole layers pinned up front (what the engine does today): a hit iff the layer is pinned."""

    def __init__(self, capacity: int, experts_per_layer: int):
        self.layers = capacity // experts_per_layer

    def access(self, key: tuple[int, int]) -> Outcome:
        return key[0] < self.layers, False, None
