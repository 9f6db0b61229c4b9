"""The GPU's own gather of routed experts and settle fill (io/cuda_gather.py), on CUDA only.

The kernel is CUDA source MLX compiles with nvrtc: it exists only on MLX's CUDA backend, so this
file runs there (bench/cuda_check.sh slot-tests) and is skipped elsewhere. What it checks: every
routed expert's bytes come from its slot when the table has one and from the pinned file
otherwise, bit for bit, and mlx-lm's quantized expert kernel on the gathered stack computes
exactly what it computes on the resident stack. The slot path's use of it (when it is chosen,
how the pool learns the routing later) is tested on this CPU in test_slots.py with a stand-in.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from test_slot_pool import (
    OFFSETS,
    RECORD,
    TENSORS,
    assert_holds,
    deferred_pool,
    pool_over,
)

from streamer.cache import settle
from streamer.cache.landing import landing_for
from streamer.cache.slot_memory import SlotTensor
from streamer.cache.slot_pool import READERS

pytestmark = pytest.mark.skipif(
    not (mx.default_device() == mx.gpu and mx.cuda.is_available()),
    reason="the gather kernel is CUDA source: it runs on MLX's CUDA backend only",
)


@pytest.fixture
def pinned(tmp_path, monkeypatch):
    """A pool of 3 slots over two layers of 6 experts, files locked whole and mapped."""
    pool, truth = pool_over(
        tmp_path, slots=3, landing=landing_for(TENSORS, READERS, True, "pinned", 1 << 30)
    )
    yield pool, truth
    pool.close()


def test_routed_experts_come_from_their_slots_or_the_pinned_file(pinned):
    from streamer.io.cuda_gather import NO_SLOT, UNWANTED, ExpertGather

    pool, truth = pinned
    slots, _ = pool.place(1, np.array([0, 4, 5]))
    gather = ExpertGather(TENSORS, np.gcd.reduce([*OFFSETS, RECORD]))  # 4-byte words
    base = pool._landing.device_address(pool.layers[1].files[0])
    sources = mx.array(np.array([[base + o, RECORD] for o in OFFSETS], dtype=np.uint64))
    table = np.full(6, NO_SLOT, dtype=np.uint32)
    table[[0, 4, 5]] = slots
    # hits, misses, a repeat, and a row no index points at (a whole prompt's unrouted expert)
    routed = np.array([[5, 2, UNWANTED, 0, 3, 3, 1]], dtype=np.uint32)
    out = gather(mx.array(routed), mx.array(table), sources, pool.arrays)
    for t, tensor in enumerate(out):
        got = np.array(tensor.view(mx.uint8)).reshape(routed.size, -1)
        for j, expert in enumerate(routed.ravel()):
            if expert != UNWANTED:  # that row is left as it is: nothing to compare
                assert np.array_equal(got[j], truth[1][expert][t]), (t, j, expert)


def test_quantized_experts_compute_the_same_on_the_gathered_stack():
    from streamer.io.cuda_gather import ExpertGather

    rng = np.random.default_rng(0)
    experts, d, hidden = 16, 256, 128
    w = mx.array(rng.standard_normal((experts, hidden, d)).astype(np.float32)).astype(mx.bfloat16)
    wq, scales, biases = mx.quantize(w, group_size=64, bits=4)
    x = mx.array(rng.standard_normal((1, 1, 1, d)).astype(np.float32)).astype(mx.bfloat16)
    routed = mx.array(np.array([[[3, 9, 14, 0]]], dtype=np.uint32))
    want = mx.gather_qmm(x, wq, scales, biases, rhs_indices=routed, transpose=True)
    # the resident stacks stand in for a pool holding expert e in slot e: every routed one hits
    # (the test above reads misses); no source address is ever read
    table = np.arange(experts, dtype=np.uint32)
    tensors = [SlotTensor(n, a.dtype, a.shape[1:]) for n, a in zip("wsb", (wq, scales, biases))]
    sources = mx.zeros((3, 2), dtype=mx.uint64)
    stack = ExpertGather(tensors, 16)(routed, mx.array(table), sources, [wq, scales, biases])
    position = mx.arange(routed.size, dtype=mx.uint32).reshape(routed.shape)
    got = mx.gather_qmm(x, *stack, rhs_indices=position, transpose=True)
    assert mx.array_equal(got, want).item()


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) << 10 for line in status if line.startswith("VmRSS:"))


def test_a_pool_holds_no_host_memory_and_reads_right(tmp_path):
    """The pool's managed pages are moved to the GPU when it is made (cache/slot_memory.py): the
    process does not grow by the pool (built from numpy, it grew by all of it, counted as file
    pages of the driver's mapping), and staged misses still land in their slots."""
    before = _rss()
    staged = landing_for(TENSORS, READERS, True, "staged", 0)
    pool, truth = pool_over(tmp_path, slots=16384, landing=staged)  # 256 MiB: largest tensor
    assert pool.nbytes > 256 << 20 and _rss() - before < pool.nbytes // 8
    slots, _ = pool.place(1, np.array([0, 4, 5]))
    out = mx.take(pool.arrays[2], mx.array(slots.astype(np.uint32)), axis=0)
    got = np.array(out.view(mx.uint8)).reshape(3, -1)
    for row, expert in zip(got, [0, 4, 5]):
        assert np.array_equal(row, truth[1][expert][2])
    pool.close()


def test_a_settle_fills_the_moved_experts_slots_on_the_gpu(tmp_path, monkeypatch):
    """A gathered pool's settle copies each expert that gained a slot with one fill kernel
    (io/cuda_gather.py SlotFill) from the pinned files, no copy-engine call: the slots then hold
    what the policy's refresh says, and a gather on the new table reads them."""
    from streamer.io.cuda_gather import NO_SLOT

    monkeypatch.setattr(settle, "FILL_ON_GPU", True)
    landing = landing_for(TENSORS, READERS, True, "gathered", 1 << 30)
    pool, truth, expected = deferred_pool(tmp_path, landing=landing)
    kernel, sources = pool.gather_source(0)
    assert pool.gather_source(1) is not None

    def no_copy(moves):
        raise AssertionError("a settle of gathered layers used the copy engine")

    landing.copy = no_copy
    pool.settle()
    assert np.array_equal(pool.policy.slot_of, expected) and pool.version == 1
    pool.fence()
    assert_holds(pool, truth)
    # a gather on the new table: layer 0's held experts from their slots, the rest from the file
    table = np.full(6, NO_SLOT, dtype=np.uint32)
    held = pool.policy.slot_of[pool.base[0] : pool.base[0] + 6]
    table[held >= 0] = held[held >= 0]
    routed = np.array([[0, 1, 2, 5]], dtype=np.uint32)
    out = kernel(mx.array(routed), mx.array(table), sources, pool.arrays)
    for t, tensor in enumerate(out):
        got = np.array(tensor.view(mx.uint8)).reshape(routed.size, -1)
        for j, expert in enumerate(routed.ravel()):
            assert np.array_equal(got[j], truth[0][expert][t]), (t, j, expert)
    pool.close()
