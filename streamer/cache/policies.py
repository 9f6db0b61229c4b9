"""Eviction policies for a budget of expert slots, keyed by (layer, expert).

`access(key)` returns (hit, admitted, evicted): whether the key was cached, whether a miss was
taken in, and which key it displaced. They choose what the engine's expert cache keeps and replay
routing traces (bench/replay_policies.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

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


class _SlotPolicy:
    """A slot pool's policy, where every miss must get a slot (it is computed with). Keys are ints
    below `keys`; a call's misses take the empty slots first, then those of the lowest `_score`.
    A slot holding a key of the current call is never a victim."""

    def __init__(self, slots: int, keys: int):
        self.slot_key = np.full(slots, -1, dtype=np.int64)  # the key each slot holds, -1: empty
        self.slot_of = np.full(keys, -1, dtype=np.int64)  # the slot each key is in, -1: none

    def _score(self) -> np.ndarray:
        """Per slot, how much it is worth keeping (only held slots' scores are read)."""
        raise NotImplementedError

    def _seen(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """A call's keys, now in `slots`."""

    def assign(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The slot of each key (distinct keys, at most as many as slots) and which are misses:
        those slots now belong to their new keys and must be filled before they are read."""
        slots = self.slot_of[keys]
        miss = slots < 0
        wanted = np.count_nonzero(miss)
        if wanted:
            empty = np.flatnonzero(self.slot_key < 0)
            if len(empty) >= wanted:
                victims = empty[:wanted]
            else:
                score = np.where(self.slot_key >= 0, self._score(), -1.0)
                score[slots[~miss]] = np.inf  # routed in this call: never a victim
                victims = np.argpartition(score, wanted - 1)[:wanted]
            self._move(keys[miss], victims)
            slots[miss] = victims
        self._seen(keys, slots)
        return slots, miss

    def empty(self, slots: np.ndarray) -> None:
        """`slots` hold no key any more (their reads failed)."""
        held = self.slot_key[slots]
        self.slot_of[held[held >= 0]] = -1
        self.slot_key[slots] = -1

    def _move(self, keys: np.ndarray, slots) -> None:
        """`keys` now in `slots`; the keys those slots held, in none."""
        evicted = self.slot_key[slots]
        self.slot_of[evicted[evicted >= 0]] = -1
        self.slot_key[slots] = keys
        self.slot_of[keys] = slots


# `SlotLFU.refresh`: how many more times a key must have been routed than a held key to take its
# slot. 0 (more often at all) keeps the misses of giving every miss a slot, on the routing
# model's traces (bench/settle_copies.py) and the trained demo model's (bench/settle_interval.py,
# 6 prompts), for 20-40% fewer copies; 1 copies a third less again, but adapts later: the demo's
# misses at 25% rose 9% over 64 tokens.
ADMIT_MARGIN = 0.0


class SlotLFU(_SlotPolicy):
    """LFU with aging for a slot pool: counts are kept for every key and halved every
    `half_life` accesses, as in LFUAging; misses evict the least frequently used keys."""

    def __init__(self, slots: int, keys: int, half_life: int = 4096):
        super().__init__(slots, keys)
        self.counts = np.zeros(keys)
        self.half_life = half_life
        self._until_halving = half_life

    def assign(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._count(keys)
        return super().assign(keys)

    def refresh(self, calls: list[np.ndarray], margin: float = ADMIT_MARGIN) -> None:
        """Calls that computed without the pool (their misses read elsewhere: cache/settle.py)
        counted, in order, and the slots then given to the most used keys: the hottest of the
        calls' keys without a slot take the empty slots, then, one for one, those of the
        coldest keys held while routed more than `margin` times more often. Unlike `assign`,
        no key must be taken: a key the calls met once does not displace a hotter one."""
        if not calls:
            return
        for keys in calls:
            self._count(keys)
        seen = np.unique(np.concatenate(calls))
        wanted = seen[self.slot_of[seen] < 0]
        wanted = wanted[np.argsort(-self.counts[wanted], kind="stable")]
        empty = np.flatnonzero(self.slot_key < 0)[: len(wanted)]
        slots = list(empty)
        held = np.flatnonzero(self.slot_key >= 0)
        rest = wanted[len(empty) :]
        if len(rest) and len(held):
            coldest = held[np.argsort(self.counts[self.slot_key[held]], kind="stable")]
            beaten = self.counts[rest[: len(coldest)]] > (
                self.counts[self.slot_key[coldest[: len(rest)]]] + margin
            )
            slots += list(coldest[: np.argmin(beaten) if not beaten.all() else len(beaten)])
        self._move(wanted[: len(slots)], slots)

    def _count(self, keys: np.ndarray) -> None:
        """One call's keys counted, the counts halved first when `half_life` accesses passed."""
        self._until_halving -= len(keys)
        if self._until_halving <= 0:
            self.counts /= 2
            self._until_halving += self.half_life
        self.counts[keys] += 1

    def _score(self) -> np.ndarray:
        return self.counts[self.slot_key]


class SlotLRU(_SlotPolicy):
    """Least recently used for a slot pool: misses evict the keys of the oldest calls."""

    def __init__(self, slots: int, keys: int):
        super().__init__(slots, keys)
        self.last_call = np.zeros(slots)  # the call that last routed each slot's key
        self._calls = 0

    def _score(self) -> np.ndarray:
        return self.last_call

    def _seen(self, keys: np.ndarray, slots: np.ndarray) -> None:
        self._calls += 1
        self.last_call[slots] = self._calls
