"""Misses admitted into slots as the gather kernel reads them (cache/admission.py, off by
default: settle.ADMIT_AS_READ): the admission rule on hand-made cases; gathered decode with
stand-ins for both kernels on this CPU (io/cuda_gather.py SlotAdmit and ExpertGather's plan mode);
and on CUDA, the same decode with the kernels themselves (which test_cuda_gather.py checks
against `admit` on random states)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
import test_slots
from conftest import reference_model
from test_parity import PROMPT, greedy_tokens
from test_slot_pool import HostFill, HostLanding, host_sources
from test_slots import GatherStandIn, slot_bytes

import streamer
from streamer.cache import admission, settle, slot_pool
from streamer.cache.admission import admit
from streamer.experts import slots as slot_calls
from streamer.io import cuda_gather
from streamer.io.cuda_gather import NO_SLOT

float32_model = test_slots.float32_model  # the fixture, shared
# The stand-ins write the device's arrays through host views as each call is built, ahead of
# anything queued: exact under the CPU backend's order only. On a GPU the kernels themselves run,
# in test_admitting_on_the_gpu_matches_the_resident_model.
stand_ins = pytest.mark.skipif(
    mx.default_device() != mx.cpu, reason="host stand-ins for CUDA kernels: the CPU backend's"
)
on_cuda = pytest.mark.skipif(
    not (mx.default_device() == mx.gpu and mx.cuda.is_available()),
    reason="the admission and gather kernels are CUDA source: MLX's CUDA backend only",
)


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


class AdmitStandIn:
    """io/cuda_gather.py SlotAdmit on this CPU: `admit` on the device's arrays, written in place
    (the kernel's `table`, `owner` and `cursor`), run as the call is built: each call's routing
    pull computes everything before it, as MLX's stream runs the kernel after it."""

    def __init__(self):
        self.tables: list[mx.array] = []  # every device table it updated

    def __call__(self, routed, base, table, owner, queue, counts, cursor, after) -> mx.array:
        views = [np.array(a, copy=False) for a in (table, owner, cursor)]
        table_, owner_ = (np.where(v == NO_SLOT, -1, v.astype(np.int64)) for v in views[:2])
        keys = int(np.array(base)[0]) + np.array(routed).ravel().astype(np.int64)
        queue_, counts_ = np.array(queue).astype(np.int64), np.array(counts)
        source, to, views[2][0] = admit(keys, table_, owner_, queue_, counts_, int(views[2][0]))
        views[0][:], views[1][:] = table_.astype(np.uint32), owner_.astype(np.uint32)
        if not any(t is table for t in self.tables):
            self.tables.append(table)
        return mx.array(np.stack([source, to]).astype(np.uint32))


class PlanGatherStandIn:
    """ExpertGather's plan mode on this CPU for `pool` (sources: host addresses, HostLanding):
    each entry's rows from its plan's slot, else from the file (never from the pool: a miss read
    there would be another expert's), and written into the slot the plan admits it to."""

    def __init__(self, pool):
        self.pool, self.hits, self.misses, self.admitted = pool, 0, 0, 0

    def __call__(self, routed, plan, sources, arrays) -> list[mx.array]:
        routed, plan, sources = np.array(routed).ravel(), np.array(plan), np.array(sources)
        distinct = np.unique(routed, return_index=True)[1]
        self.hits += int(np.count_nonzero(plan[0, distinct] != NO_SLOT))
        self.misses += int(np.count_nonzero(plan[0, distinct] == NO_SLOT))
        self.admitted += int(np.count_nonzero(plan[1] != NO_SLOT))
        stacks = []
        for t, tensor in enumerate(self.pool.tensors):
            rows = []
            for expert, slot, to in zip(routed, *plan):
                row = np.empty(tensor.nbytes, np.uint8)
                if slot != NO_SLOT:
                    row[:] = np.array(arrays[t][int(slot)].view(mx.uint8)).ravel()
                else:
                    address = int(sources[t, 0]) + int(expert) * int(sources[t, 1])
                    ctypes.memmove(row.ctypes.data, address, tensor.nbytes)
                if to != NO_SLOT:
                    self.pool._rows[0][t][int(to)][:] = row
                rows.append(row)
            stacks.append(mx.array(np.stack(rows)).view(tensor.dtype).reshape(-1, *tensor.shape))
        return stacks


def assert_slots_hold_their_experts(pool, sources: dict[int, np.ndarray]):
    """Every held slot of `pool` holds its expert's bytes, read from the files' host mappings
    (`sources`: host_sources per layer)."""
    first = sorted((base, layer) for layer, base in pool.base.items())
    for slot, key in enumerate(pool.policy.slot_key.tolist()):
        if key < 0:
            continue
        base, layer = max(b for b in first if b[0] <= key)
        for t, tensor in enumerate(pool.tensors):
            want = np.empty(tensor.nbytes, np.uint8)
            at = int(sources[layer][t, 0]) + (key - base) * int(sources[layer][t, 1])
            ctypes.memmove(want.ctypes.data, at, tensor.nbytes)
            assert np.array_equal(pool._rows[0][t][slot], want), (slot, key, t)


def no_refresh(*args):
    raise AssertionError("a settle replayed the refresh: admissions leave it nothing to do")


def admitting_model(monkeypatch, folder, slots: int) -> SimpleNamespace:
    """The model at `folder` on a pool of `slots` slots, ADMIT_AS_READ on, with stand-ins for
    the kernels (`admit`, `gather` in plan mode, `fill`; the table mode GatherStandIn) and the
    files' host mappings as their sources (`sources`, per layer)."""
    monkeypatch.setattr(settle, "ADMIT_AS_READ", True)
    monkeypatch.setattr(slot_pool, "landing_for", lambda *args: HostLanding())
    run = SimpleNamespace(admit=AdmitStandIn(), sources={})

    def gather_kernel(tensors, source, bases):
        kernel = GatherStandIn(tensors, source)  # the table mode: a whole prompt's
        kernel.alignment = 4
        run.sources[len(run.sources)] = host_sources(source, bases)
        return kernel, run.sources[len(run.sources) - 1]

    monkeypatch.setattr(settle, "gather_kernel", gather_kernel)
    monkeypatch.setattr(slot_pool, "replay", no_refresh)
    monkeypatch.setattr(cuda_gather, "SlotAdmit", lambda slots: run.admit)
    monkeypatch.setattr(cuda_gather, "ExpertGather", lambda tensors, alignment, admits: run.gather)
    monkeypatch.setattr(cuda_gather, "SlotFill", lambda tensors: run.fill)
    run.model, run.tokenizer = streamer.load(
        folder, memory_budget=slots * slot_bytes(folder), read_path="slots"
    )
    (run.pool,) = run.model.streamer.pools
    run.fill, run.gather = HostFill(run.pool), PlanGatherStandIn(run.pool)
    return run


@stand_ins
@pytest.mark.parametrize("settle_tokens", [1, 3])
@pytest.mark.parametrize("slots", [6, 16])
def test_gathered_decode_admitting_misses_matches_the_resident_model(
    float32_model, monkeypatch, settle_tokens, slots
):
    """2 layers x top-4 of 16 experts, ADMIT_AS_READ on: decode calls admit misses as they read
    them (stand-ins for both kernels), the settles only count (no refresh, no fill), and the
    tokens are the resident model's. The stats count what the GPU found, the host's replica ends
    equal to the device's table and every held slot holds its expert. 6 slots: each prompt syncs
    (too many routes to gather), the second after admissions, with the policy as the replays
    left it, and moves slots: the next decode calls admit on a new table. 16: each prompt is
    gathered whole by the device's table (admitting nothing) and nothing syncs."""
    src, folder = float32_model
    monkeypatch.setattr(settle, "SETTLE_TOKENS", settle_tokens)
    run = admitting_model(monkeypatch, folder, slots)
    pool, gather, stats = run.pool, run.gather, run.model.streamer.stats
    reference, tokens, whole = reference_model(src), 24, slots == 16
    for n, text in enumerate([PROMPT, "Files hold the experts"]):
        prompt = mx.array(run.tokenizer.encode(text))
        assert greedy_tokens(run.model, prompt, tokens) == greedy_tokens(reference, prompt, tokens)
        decode, prefill = stats.decode, stats.prefill
        assert decode.syncs == 0 and prefill.syncs == (0 if whole else 2 * (n + 1))
        # the synced prompts' misses filled by the kernel, in rounds; the settles copy nothing
        assert sum(run.fill.moves) == prefill.experts_read * (not whole)
        assert decode.cache_hits == gather.hits > 0 and decode.experts_read == gather.misses > 0
        assert decode.cache_hits + decode.experts_read == 4 * decode.layer_calls
        # a synced call moved slots: a new table uploaded; the device's, the host's replica
        assert len(run.admit.tables) == (1 if whole else n + 1)
        device = np.array(run.admit.tables[-1]).astype(np.int64)
        assert np.array_equal(pool.policy.slot_of, np.where(device == NO_SLOT, -1, device))
        assert_slots_hold_their_experts(pool, run.sources)
    assert gather.admitted > 0
    run.model.streamer.close()


@stand_ins
def test_synced_calls_after_admissions_match_the_resident_model(float32_model, monkeypatch):
    """16 slots, prompts not gathered whole: the first prompt syncs (a call a layer), its decode
    admits misses, then every call syncs (no gathered call: a second prompt and its decode),
    placing experts on the policy the replays left. Each layer's table names the slots the
    device holds, admissions included (a layer's own upload, made before them, would name the
    old ones; a synced call with no miss reads by it). The resident model's tokens."""
    src, folder = float32_model
    monkeypatch.setattr(slot_calls, "WHOLE_PROMPTS", False)
    run = admitting_model(monkeypatch, folder, 16)
    reference, tokens, stats = reference_model(src), 24, run.model.streamer.stats
    for text, gathered in [(PROMPT, slot_calls.GATHERED_ROUTES), ("Files hold the experts", 0)]:
        monkeypatch.setattr(slot_calls, "GATHERED_ROUTES", gathered)
        prompt = mx.array(run.tokenizer.encode(text))
        assert greedy_tokens(run.model, prompt, tokens) == greedy_tokens(reference, prompt, tokens)
        assert stats.decode.syncs == 0 if gathered else stats.decode.syncs > 0
        held = run.pool.policy.slot_of.astype(np.uint32)  # settled: the device's (-1: NO_SLOT)
        for layer in run.model.streamer.layers:
            base, mode = run.pool.base[layer.index], layer.compute_mode
            if mode._version == run.pool.version:  # a table it would read by
                assert np.array_equal(np.array(mode._table), held[base : base + 16])
    assert run.gather.admitted > 0
    assert_slots_hold_the_resident_experts(run.pool, reference)
    run.model.streamer.close()


def assert_slots_hold_the_resident_experts(pool, model):
    """Every held slot of `pool` holds its expert's tensors as the resident `model` has them."""
    first = sorted((base, layer) for layer, base in pool.base.items())
    for slot, key in enumerate(pool.policy.slot_key.tolist()):
        if key < 0:
            continue
        base, layer = max(b for b in first if b[0] <= key)
        switch = model.layers[layer].mlp.switch_mlp
        for t, tensor in enumerate(pool.tensors):
            proj, name = tensor.name.split(".")
            want = getattr(getattr(switch, proj), name)[key - base]
            assert mx.array_equal(pool.arrays[t][slot], want), (slot, key, tensor.name)


@on_cuda
@pytest.mark.parametrize("slots", [6, 16])
def test_admitting_on_the_gpu_matches_the_resident_model(float32_model, monkeypatch, slots):
    """The kernels themselves, ADMIT_AS_READ on, prompts synced: the first prompt's decode
    gathers and admits its misses; the second prompt and its decode sync (after admissions, on
    the table they left). The resident model's tokens; once settled the device's table is the
    host's replica, which admitted experts (the replay's `admit`, as the kernel did); every held
    slot holds its expert."""
    src, folder = float32_model
    monkeypatch.setattr(settle, "ADMIT_AS_READ", True)
    monkeypatch.setattr(slot_calls, "WHOLE_PROMPTS", False)
    admitted = []

    def counted(*args):
        source, to, cursor = admit(*args)
        admitted.append(int(np.count_nonzero(to >= 0)))
        return source, to, cursor

    monkeypatch.setattr(admission, "admit", counted)
    model, tokenizer = streamer.load(
        folder, memory_budget=slots * slot_bytes(folder), read_path="slots"
    )
    (pool,) = model.streamer.pools
    reference, stats = reference_model(src), model.streamer.stats
    for text, gathered in [(PROMPT, slot_calls.GATHERED_ROUTES), ("Files hold the experts", 0)]:
        monkeypatch.setattr(slot_calls, "GATHERED_ROUTES", gathered)
        prompt = mx.array(tokenizer.encode(text))
        assert greedy_tokens(model, prompt, 24) == greedy_tokens(reference, prompt, 24)
        pool.settle()
        device = np.array(pool.admission.table(pool.version, pool.policy.slot_of)).astype(np.int64)
        assert np.array_equal(pool.policy.slot_of, np.where(device == NO_SLOT, -1, device))
        assert_slots_hold_the_resident_experts(pool, reference)
    assert sum(admitted) > 0 and stats.decode.gathered > 0 and stats.decode.syncs > 0
    model.streamer.close()


@stand_ins
def test_a_prompts_unevaluated_outputs_read_the_pool_before_admissions(float32_model, monkeypatch):
    """A synced prompt's last layer: mlx-lm evaluates the prompt's caches, not its last layer's
    experts, so that output is still to compute when decode begins to admit misses, and reads
    the slots and the table as it finds them then. Queued before the first admission (the
    reuse rule a settle's fill keeps), it is the resident layer's; computed after, it read slots
    the admissions gave to other experts (on an H100: a table entry they cleared, a fault)."""
    src, folder = float32_model
    monkeypatch.setattr(slot_calls, "WHOLE_PROMPTS", False)
    run = admitting_model(monkeypatch, folder, 16)
    last = run.model.streamer.layers[-1]
    calls: list = []
    original = slot_calls.Slots.__call__

    def kept(mode, layer, x, indices, traffic):
        out = original(mode, layer, x, indices, traffic)
        if layer is last and indices.shape[1] > 1:  # the prompt's call
            calls.append((x, indices, out))
        return out

    monkeypatch.setattr(slot_calls.Slots, "__call__", kept)
    prompt = mx.array(run.tokenizer.encode(PROMPT))
    greedy_tokens(run.model, prompt, 24)
    assert run.gather.admitted > 0 and len(calls) == 1
    x, indices, out = calls[0]
    resident = reference_model(src).layers[last.index].mlp.switch_mlp(x, indices)
    assert np.array_equal(np.array(out), np.array(resident))
    run.model.streamer.close()
