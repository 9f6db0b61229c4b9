"""Misses admitted into slots as the gather kernel reads them (cache/admission.py, off by
default: settle.ADMIT_AS_READ): the admission rule on hand-made cases (the kernels themselves
are checked against `admit` in test_cuda_gather.py, on CUDA only)."""

from __future__ import annotations

import numpy as np

from streamer.cache.admission import admit


def state(slots: int, keys: int, held: dict[int, int]):
    """A table (key -> slot) and owner (slot -> key), -1 for none, with `held` key -> slot."""
    table, owner = np.full(keys, -1, dtype=np.int64), np.full(slots, -1, dtype=np.int64)
    for key, slot in held.items():
        table[key], owner[slot] = slot, key
    return table, owner


def assert_inverse(table, owner):
    held = np.flatnonzero(table >= 0)
    assert np.array_equal(owner[table[held]], held)
    assert np.count_nonzero(owner >= 0) == len(held)


def test_a_miss_takes_an_empty_slot_first_and_a_hit_is_never_a_victim():
    """Slot 0 (the queue's first, coldest) holds key 5, which the call routes: passed over; the
    empty slot 2 comes before the held slot 1 in a settle's queue, so the first miss takes it,
    and the second takes slot 1 from key 3, routed less often."""
    table, owner = state(3, 8, {5: 0, 3: 1})
    counts = np.array([0, 2, 4, 1, 0, 1, 0, 0], dtype=np.float32)
    queue = np.array([2, 0, 1])  # empty first, then by ascending count: the settle's order
    keys = np.array([1, 5, 2])
    source, to, cursor = admit(keys, table, owner, queue, counts, 0)
    assert source.tolist() == [-1, 0, -1]  # key 1 and 2 read from the files, 5 from its slot
    assert to.tolist() == [2, -1, 1] and cursor == 3
    assert table[1] == 2 and table[2] == 1 and table[3] == -1 and table[5] == 0
    assert_inverse(table, owner)


def test_a_miss_routed_no_more_often_than_the_coldest_held_stays_a_miss():
    """Key 4 was routed as often as slot 0's key 6: no admission, the cursor stays; key 7,
    routed more often, then takes that slot."""
    table, owner = state(2, 8, {6: 0, 2: 1})
    counts = np.array([0, 0, 5, 0, 1, 0, 1, 3], dtype=np.float32)
    source, to, cursor = admit(np.array([4, 7]), table, owner, np.array([0, 1]), counts, 0)
    assert source.tolist() == [-1, -1] and to.tolist() == [-1, 0] and cursor == 1
    assert table[4] == -1 and table[7] == 0 and table[6] == -1
    assert_inverse(table, owner)


def test_a_repeated_key_is_admitted_once_and_the_queue_ends_admissions():
    """Two tokens in one call route key 3 twice: the first entry takes the empty slot, the
    repeat reads the file too and writes nothing. The queue then has no slot left: key 4 stays a
    miss (the next call of the epoch too)."""
    table, owner = state(1, 6, {})
    counts = np.zeros(6, dtype=np.float32)
    keys = np.array([3, 3, 4])
    source, to, cursor = admit(keys, table, owner, np.array([0]), counts, 0)
    assert source.tolist() == [-1, -1, -1] and to.tolist() == [0, -1, -1] and cursor == 1
    source, to, cursor = admit(np.array([4]), table, owner, np.array([0]), counts, cursor)
    assert to.tolist() == [-1] and table[3] == 0 and table[4] == -1
    assert_inverse(table, owner)


def test_admissions_on_random_states_keep_table_and_owner_inverse():
    rng = np.random.default_rng(0)
    for _ in range(200):
        slots, keys = int(rng.integers(1, 9)), 24
        held = rng.choice(keys, size=int(rng.integers(0, slots + 1)), replace=False)
        table, owner = state(slots, keys, dict(zip(held.tolist(), rng.permutation(slots))))
        counts = rng.integers(0, 4, keys).astype(np.float32)
        queue, cursor = rng.permutation(slots), 0
        for _ in range(4):
            routed = rng.integers(0, keys, int(rng.integers(1, 9)))
            before = table[routed].copy()
            source, to, cursor = admit(routed, table, owner, queue, counts, cursor)
            assert np.array_equal(source, before)
            victims = to[to >= 0]
            assert len(set(victims.tolist())) == len(victims)  # a slot taken once a call
            assert not set(victims.tolist()) & set(source[source >= 0].tolist())
            assert_inverse(table, owner)
