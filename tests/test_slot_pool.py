"""The slot pool on its own: exact reads into slots, LFU victims, the reuse fence, O_DIRECT."""

from __future__ import annotations

import ctypes
from contextlib import nullcontext

import mlx.core as mx
import numpy as np
import pytest

from streamer.cache import settle, slot_pool
from streamer.cache.policies import SlotLFU
from streamer.cache.slot_memory import SLOT_ALIGN, LayerSource, SlotTensor
from streamer.cache.slot_pool import CHUNK_BYTES, SlotPool
from streamer.errors import StreamerError
from streamer.io import buffers, cuda_gather
from streamer.io.mapping import OS_PAGE, resident_bytes
from streamer.io.reads import ReadFile
from streamer.loading.backend import backend

# An expert record as repack writes one: tensors 64-byte aligned back to back (a gap after the
# odd-sized first one), the record padded to a 16 KiB boundary.
TENSORS = (
    SlotTensor("a.weight", mx.uint32, (3, 5)),
    SlotTensor("a.scales", mx.bfloat16, (3, 2)),
    SlotTensor("b.weight", mx.uint32, (4, 1024)),
)
OFFSETS = (0, 64, 128)
RECORD = 2 * SLOT_ALIGN


class At:  # where a tensor of expert e lies: offset + e * stride of file 0
    def __init__(self, offset: int):
        self.file, self.offset, self.stride = 0, offset, RECORD


def write_layer(path, experts: int, seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    data = bytearray(RECORD * experts)
    truth = []
    for e in range(experts):
        parts = []
        for t, offset in zip(TENSORS, OFFSETS):
            raw = rng.integers(0, 256, t.nbytes, dtype=np.uint8)
            data[e * RECORD + offset : e * RECORD + offset + t.nbytes] = raw.tobytes()
            parts.append(raw)
        truth.append(parts)
    path.write_bytes(bytes(data))
    return truth


def pool_over(
    tmp_path,
    slots: int,
    layers: int = 2,
    experts: int = 6,
    bypass=False,
    chunk_bytes=CHUNK_BYTES,
    landing=None,
):
    truth = {}
    files = {}
    for layer in range(layers):
        path = tmp_path / f"{layer:03d}.bin"
        truth[layer] = write_layer(path, experts, seed=layer)
        at = [At(offset) for offset in OFFSETS]
        files[layer] = LayerSource([ReadFile(path, bypass)], at, experts, where=lambda _, p=path: p)
    return SlotPool(TENSORS, slots, files, chunk_bytes, landing), truth


def slot_bytes(pool: SlotPool, slot: int) -> list[np.ndarray]:
    chunk, row = divmod(slot, pool.chunk_slots)
    return [np.array(a[row].view(mx.uint8)).ravel() for a in pool.chunks[chunk]]


LARGEST = max(t.nbytes for t in TENSORS)


@pytest.mark.parametrize(
    "bypass, chunk_bytes, piece",
    [(False, CHUNK_BYTES, 1 << 19), (True, CHUNK_BYTES, 1 << 19), (False, 3 * LARGEST, 4096)],
)
def test_misses_are_read_exactly_into_their_slots(
    tmp_path, monkeypatch, bypass, chunk_bytes, piece
):
    """With chunks of 3 slots too: slot s is row s % 3 of chunk s // 3, each array bounded; and
    with reads cut into 4 KiB pieces (a tensor read by several threads)."""
    monkeypatch.setattr(slot_pool, "PIECE", piece)
    pool, truth = pool_over(tmp_path, slots=4, bypass=bypass, chunk_bytes=chunk_bytes)
    assert len(pool.chunks) == (1 if chunk_bytes == CHUNK_BYTES else 2)
    for a in [a for chunk in pool.chunks for a in chunk]:
        assert np.asarray(memoryview(a.view(mx.uint8))).ctypes.data % SLOT_ALIGN == 0
        assert a.nbytes <= chunk_bytes
    for layer, experts in [(0, [1, 4]), (1, [0, 1, 5]), (0, [2, 3, 4])]:
        slots, _ = pool.place(layer, np.array(experts))
        for expert, slot in zip(experts, slots):
            for got, want in zip(slot_bytes(pool, slot), truth[layer][expert]):
                assert np.array_equal(got, want)
    pool.close()


def test_hits_cost_nothing_and_the_calls_own_experts_are_never_victims(tmp_path):
    pool, _ = pool_over(tmp_path, slots=3)
    slots, misses = pool.place(0, np.array([0, 1, 2]))
    assert misses == 3 and sorted(slots) == [0, 1, 2]
    for _ in range(5):  # expert 0 and 1 become hot
        assert pool.place(0, np.array([0, 1]))[1] == 0
    again, misses = pool.place(0, np.array([1, 2, 3]))  # 0 is the only slot not routed: evicted
    assert misses == 1 and again[2] == slots[0] and list(again[:2]) == list(slots[1:])
    pool.close()


def test_lfu_keeps_hot_keys_through_a_scan():
    policy = SlotLFU(slots=3, keys=100)
    for _ in range(20):
        policy.assign(np.array([0, 1]))
    for cold in range(2, 60):
        policy.assign(np.array([cold]))
    slots, miss = policy.assign(np.array([0, 1]))
    assert not miss.any()  # each one-off key took the slot of the previous one-off


def test_a_slot_is_not_rewritten_while_a_lazy_output_still_reads_it(tmp_path):
    """Without the fence the first output would be computed from the second expert's bytes."""
    pool, truth = pool_over(tmp_path, slots=1)
    weights = pool.arrays[2]  # U32 [slots, 4, 1024]
    (slot,), _ = pool.place(0, np.array([3]))
    first = weights[slot] + 0  # lazy: nothing computed yet
    pool.computed(first)
    pool.place(1, np.array([5]))  # a miss: must evaluate `first` before overwriting its slot
    assert np.array_equal(np.array(first).view(np.uint8).ravel(), truth[0][3][2])
    assert np.array_equal(slot_bytes(pool, slot)[2], truth[1][5][2])
    pool.close()


@pytest.mark.parametrize("gathers", [False, True])
def test_a_failed_read_leaves_no_half_read_expert(tmp_path, monkeypatch, gathers):
    """Also where kernels may read the files (CUDA's gathered landing, here a host stand-in that
    maps them as it does): the mapping's failure is the read's (on an H100 it escaped the read's
    error handling once)."""
    monkeypatch.setattr(settle, "FILL_ON_GPU", True)
    pool, _ = pool_over(tmp_path, slots=2, landing=HostLanding() if gathers else None)
    (tmp_path / "001.bin").write_bytes(b"")  # truncated under the open file
    with pytest.raises(StreamerError, match="001.bin: cannot read expert 2"):
        pool.place(1, np.array([2]))
    assert pool.policy.slot_of[pool.base[1] + 2] == -1
    pool.close()


def test_a_pools_pages_are_committed_only_as_slots_are_read(tmp_path, monkeypatch):
    """A budget is an upper bound, not an allocation: untouched slots take no memory. (Chunks of
    64 MB: glibc maps fresh pages for any allocation past 32 MB, and MLX's cache is emptied, so
    no recycled buffer is handed out.) Reads land in the slots here on every backend: CUDA's
    staging has the copy engine write them, and no host page of the pool is ever committed."""
    if backend() == "cuda":  # measured on an H200: all 16384 pages of a chunk committed
        pytest.skip("on CUDA the pool is built from numpy (io/buffers.py): committed when made")
    monkeypatch.setattr(
        slot_pool, "landing_for", lambda tensors, buffers, page_cache, misses, pinnable: None
    )
    mx.clear_cache()
    pool, _ = pool_over(tmp_path, slots=8192, chunk_bytes=4096 * LARGEST)  # 2 chunks of 64 MB
    rows = pool._rows[1][2]  # chunk 1's b.weight rows
    assert mincore_pages(rows) == 0
    pool.place(0, np.array([1]))  # slot 0: chunk 0
    assert mincore_pages(rows) == 0 and mincore_pages(pool._rows[0][2][:1]) > 0
    pool.close()


def mincore_pages(rows: np.ndarray) -> int:
    """Pages of `rows` in memory (mincore counts an anonymous page once it is written)."""
    return resident_bytes(rows.ctypes.data, 0, rows.nbytes) // OS_PAGE


@pytest.mark.parametrize("cuda", [False, True])
def test_a_buffer_written_through_its_host_view_is_what_mlx_reads(monkeypatch, cuda):
    """Either allocation (untouched through mx.load; from numpy, as on CUDA): the host view and
    the array are one memory, and a view may span rows and, on the CPU, start at any byte. A GPU
    is given aligned views only (slot rows start on SLOT_ALIGN): on an H200 a uint16 view at an
    odd byte read its first element and zeros."""
    monkeypatch.setattr(buffers.mx.cuda, "is_available", lambda: cuda)
    buffer = buffers.untouched(3 * buffers.ROW)
    host = buffers.host_bytes(buffer)
    start = buffers.ROW - (3 if backend() == "cpu" else 4)
    host[start : start + 8] = np.arange(1, 9, dtype=np.uint8)
    view = buffers.view(buffer, start, mx.uint16, (2, 2), (1, 2))
    assert np.array(view).tolist() == [[0x0201, 0x0605], [0x0403, 0x0807]]


ROUTINGS = [(0, [1, 4]), (1, [0, 1]), (0, [2, 4]), (1, [3, 5]), (0, [0, 1])]  # sorted, as routed


def deferred_pool(tmp_path, landing=None, count=lambda experts: None):
    """A 3-slot pool (with `landing`) that deferred ROUTINGS, given `count`; the slot of each key
    once a fresh policy is given them (SlotLFU.refresh): (pool, truth, expected slot_of)."""
    pool, truth = pool_over(tmp_path, slots=3, landing=landing)
    for layer, experts in ROUTINGS:
        pool.defer(layer, mx.array(np.array([experts], dtype=np.uint32)), count)
    policy = SlotLFU(pool.slots, len(pool.policy.slot_of))
    policy.refresh([pool.base[layer] + np.array(experts) for layer, experts in ROUTINGS])
    held = set(np.flatnonzero(policy.slot_of >= 0).tolist())
    assert len(held) == 3 and {1, 4} <= held  # layer 0's experts routed twice, and one more
    return pool, truth, policy.slot_of


def assert_holds(pool, truth):
    """Every held slot of `pool` (two layers) holds its expert's bytes as `truth` has them."""
    for slot, key in enumerate(pool.policy.slot_key):
        layer = int(key >= pool.base[1])
        for got, want in zip(slot_bytes(pool, slot), truth[layer][key - pool.base[layer]]):
            assert np.array_equal(got, want), (slot, key)


def test_settled_routings_refresh_the_slots(tmp_path):
    """Gathered calls only record their routing (`defer`); `settle` gives it to the policy in
    order (SlotLFU.refresh), so the pool then holds the most routed experts (layer 0's 1 and 4,
    routed twice, and one of those routed once), each moved expert's bytes in its slot, and its
    version says the tables changed."""
    counted = []  # each call's distinct experts, given to its count at the settle
    pool, truth, expected = deferred_pool(tmp_path, count=counted.append)
    pool.settle_earlier_tokens()  # far from SETTLE_TOKENS tokens' worth: not due
    assert pool.version == 0 and counted == []
    pool.settle()
    assert pool.version == 1
    assert [c.tolist() for c in counted] == [experts for _, experts in ROUTINGS]
    assert np.array_equal(pool.policy.slot_of, expected)
    assert_holds(pool, truth)
    pool.settle()  # nothing deferred: nothing moves
    assert pool.version == 1
    pool.defer(0, mx.array(np.array([[3, 5]], dtype=np.uint32)), counted.append)
    pool.close()  # a call deferred at the end is counted, and nothing read from closed files
    assert counted[-1].tolist() == [3, 5] and pool.version == 1
    pool.settle()  # what reading the stats after close does: nothing left to settle


def test_a_settles_pull_gives_each_call_its_distinct_experts_sorted():
    """settle.distinct: decode calls ([1, 1, k], distinct experts) in one sort; calls of one
    shape with a repeat (a batch of tokens) and calls of several shapes deduplicated one by one;
    on the CPU backend the pull's stream is the CPU's."""
    assert (settle.pull_stream() == mx.cpu) == (mx.default_device() == mx.cpu)
    rows = [[5, 1, 3], [2, 7, 0], [9, 8, 4]]
    decode = [mx.array(np.array([[r]], dtype=np.uint32)) for r in rows]
    assert [d.tolist() for d in settle.distinct(decode)] == [sorted(r) for r in rows]
    batch = [mx.array(np.array([[1, 2], [2, 3]], dtype=np.uint32))] * 2  # one shape, a repeat
    assert [d.tolist() for d in settle.distinct(batch)] == [[1, 2, 3], [1, 2, 3]]
    mixed = [decode[0], batch[0], mx.array(np.array([4], dtype=np.uint32))]
    assert [d.tolist() for d in settle.distinct(mixed)] == [[1, 3, 5], [1, 2, 3], [4]]
    assert settle.distinct([]) == []


def test_settles_come_sooner_after_a_synced_call_moved_slots(tmp_path):
    """At a token's first gathered call the pool settles every token's calls but the last's,
    once they are SETTLE_TOKENS tokens' worth (the GPU may still compute the last token). After
    a prompt's synced calls read misses: 1 token's worth, then 2, 4, ... (until a settle, an
    expert that missed misses again on every call routing it)."""
    pool, _ = pool_over(tmp_path, slots=4)
    counted = []  # the settled calls' distinct experts

    def settles(tokens: int) -> list[tuple[int, int]]:
        """(token, tokens' calls settled) of each settle over `tokens` tokens of 2 layers."""
        done = []
        for token in range(tokens):
            pool.settle_earlier_tokens()
            if counted:
                done.append((token, len(counted) // 2))
                counted.clear()
            for layer in (0, 1):
                pool.defer(layer, mx.array(np.array([[0, 1]], dtype=np.uint32)), counted.append)
        return done

    assert settles(50) == [(17, 16), (33, 16), (49, 16)]  # nothing placed yet
    pool.place(0, np.array([2, 3]))  # misses read: the slots moved under a synced call
    assert len(counted) == 4  # place settled everything first: the last 2 tokens
    counted.clear()
    assert settles(49) == [(2, 1), (4, 2), (8, 4), (16, 8), (32, 16), (48, 16)]
    pool.place(1, np.array([0, 1]))  # hits only (the settles placed them): nothing moved
    counted.clear()
    assert settles(18) == [(17, 16)]
    pool.close()


def test_a_settle_that_fails_to_read_leaves_no_slot_claiming_an_expert(tmp_path):
    pool, _ = pool_over(tmp_path, slots=4)
    pool.layers[1].checksums = [[0, 0, 0]] * 6  # layer 1's reads all fail their checksums
    pool.defer(0, mx.array(np.array([[2, 3]], dtype=np.uint32)), lambda experts: None)
    pool.defer(1, mx.array(np.array([[4, 5]], dtype=np.uint32)), lambda experts: None)
    with pytest.raises(StreamerError, match="does not match its checksum"):
        pool.settle()
    held = pool.policy.slot_key[pool.policy.slot_key >= 0]
    assert sorted(held.tolist()) == [2, 3]  # layer 0's, read; layer 1's forgotten
    assert all(pool.policy.slot_key[pool.policy.slot_of[k]] == k for k in held)
    pool.close()


class HostLanding:
    """A landing whose kernels "reach" each file at its host mapping (CUDA's gathered landing
    gives the device address of the pinned file instead): reads land in the slots."""

    buffers, reads_files, gathers = slot_pool.READERS, False, True

    def __init__(self):
        self.maps = {}

    def into(self, rows):
        return nullcontext(rows)

    def device_address(self, file) -> int:
        if file.size() == 0:  # mmap refuses an empty file
            raise OSError("short read: the file is empty")
        self.maps.setdefault(file.path, np.memmap(file.path, mode="r"))
        return self.maps[file.path].ctypes.data

    def close(self):
        self.maps.clear()


class HostFill:
    """io/cuda_gather.py SlotFill on this CPU for `pool`: once every kernel queued before it has
    run (MLX's stream runs the real one after them), each move's tensors copied from its
    addresses (host mappings here) into its slot; its lazy output is what the pool's next fence
    waits on."""

    def __init__(self, pool: SlotPool):
        self.pool, self.moves, self.outputs = pool, [], []

    def __call__(self, slots, addresses, arrays):
        assert arrays is self.pool.arrays
        mx.synchronize()
        self.moves.append(len(slots))
        for slot, row in zip(slots, addresses):
            for t, (tensor, address) in enumerate(zip(self.pool.tensors, row)):
                ctypes.memmove(self.pool._rows[0][t][slot].ctypes.data, int(address), tensor.nbytes)
        self.outputs.append(mx.array([1], mx.uint32) + 0)  # lazy, as the kernel's output is
        return self.outputs[-1]


def test_a_gathered_layers_moved_experts_are_filled_by_kernel(tmp_path, monkeypatch):
    """A settle of gathered layers copies every moved expert with one fill kernel (CUDA:
    io/cuda_gather.py SlotFill, checked there) from each tensor's address in its file, queued
    after the pool's readers with no host wait, and so does a synced call's miss there. Here a
    stand-in copies by those addresses on the host: the slots end as the policy's refresh says,
    and the next write waits for the kernels' outputs (the fence)."""
    monkeypatch.setattr(settle, "gather_kernel", lambda t, s, b: (None, host_sources(s, b)))
    monkeypatch.setattr(settle, "FILL_ON_GPU", True)
    pool, truth, expected = deferred_pool(tmp_path, landing=HostLanding())
    fill = HostFill(pool)
    monkeypatch.setattr(cuda_gather, "SlotFill", lambda tensors: fill)
    assert all(pool.gather_source(layer) is not None for layer in (0, 1))

    def tensor_0_sum() -> mx.array:  # an output read from the pool
        return mx.sum(pool.arrays[0].view(mx.uint8).astype(mx.uint64))

    before = tensor_0_sum().item()
    earlier = tensor_0_sum()  # lazy: queued before the fill, so computed on the slots before it
    pool.computed(earlier)
    with monkeypatch.context() as no_wait:
        no_wait.setattr(pool, "fence", lambda: pytest.fail("a settle by fill waits for nothing"))
        pool.settle()
    assert fill.moves == [3] and pool.version == 1  # one launch: the 3 experts holding a slot
    assert earlier.item() == before != tensor_0_sum().item()
    assert np.array_equal(pool.policy.slot_of, expected)
    assert_holds(pool, truth)
    assert pool._pending == fill.outputs  # the next write's fence evaluates it
    slots, misses = pool.place(1, np.array([2]))  # a synced miss: fenced, then filled alike
    assert misses == 1 and fill.moves == [3, 1] and pool._pending == fill.outputs[-1:]
    assert all(np.array_equal(g, w) for g, w in zip(slot_bytes(pool, slots[0]), truth[1][2]))
    pool.close()


def host_sources(source: LayerSource, bases: list[int]) -> np.ndarray:
    """gather_kernel's sources: expert 0's address and the stride of each tensor."""
    return np.array(
        [[bases[at.file] + at.offset, at.stride] for at in source.placements], dtype=np.uint64
    )
