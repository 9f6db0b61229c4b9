"""The CUDA miss path's staging (io/cuda_copy.py) on this CPU: a fake runtime copies by memmove.

What the GPU adds (the copy engine, pinned memory) is checked on a CUDA machine by test_slots and
test_parity (bench/cuda_check.sh); here: the bytes reach their slots only through the staging
copies, each read's copies are waited for before its buffer is lent again, a failed read copies
nothing, and off CUDA the module is not used at all.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading

import mlx.core as mx
import numpy as np
import pytest
from test_slot_pool import RECORD, TENSORS, pool_over, slot_bytes

from streamer.cache.landing import CUDA_MISSES_DEFAULT, landing_for
from streamer.errors import StreamerError
from streamer.io import cuda_runtime
from streamer.io.cuda_copy import STAGING_ALIGN, MappedCopies, StagedCopies
from streamer.io.cuda_runtime import CudaRuntime
from streamer.io.pinning import PinAllowance
from streamer.loading.options import load_options


class FakeRuntime:
    """CudaRuntime's calls on host memory: a copy is a memmove, done when `wait` is called."""

    def __init__(self, fail_streams_after: int | None = None):
        self.allocated: dict[int, np.ndarray] = {}
        self.queued: dict[int, list[tuple[int, int, int]]] = {}
        self.copies: list[tuple[int, int, int]] = []
        self.streams = 0
        self._fail_after = fail_streams_after
        self._lock = threading.Lock()

    def host_alloc(self, nbytes: int) -> int:
        memory = np.empty(nbytes + 4096, dtype=np.uint8)
        address = memory.ctypes.data + (-memory.ctypes.data % 4096)  # pages, as CUDA's are
        self.allocated[address] = memory
        return address

    def free_host(self, address: int) -> None:
        del self.allocated[address]

    def new_stream(self) -> int:
        if self._fail_after is not None and self.streams == self._fail_after:
            raise StreamerError("CUDA cudaStreamCreateWithFlags failed: out of memory (error 2)")
        with self._lock:
            self.streams += 1
            self.queued[self.streams] = []
            return self.streams

    def destroy_stream(self, stream: int) -> None:
        assert not self.queued.pop(stream), "a stream destroyed with copies not waited for"

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        assert any(a <= src and src + nbytes <= a + m.nbytes for a, m in self.allocated.items())
        self.queued[stream].append((dst, src, nbytes))  # not yet done: nothing is written

    def wait(self, stream: int) -> None:
        for dst, src, nbytes in self.queued[stream]:
            ctypes.memmove(dst, src, nbytes)
            with self._lock:
                self.copies.append((dst, src, nbytes))
        self.queued[stream].clear()


def test_misses_reach_their_slots_through_the_staging_copies(tmp_path):
    runtime = FakeRuntime()
    landing = StagedCopies([t.nbytes for t in TENSORS], 3, runtime)
    pool, truth = pool_over(tmp_path, slots=4, landing=landing)
    for layer, experts in [(0, [1, 4, 5]), (1, [0, 1, 2, 5]), (0, [2, 3, 4])]:
        before = len(runtime.copies)
        slots, misses = pool.place(layer, np.array(experts))
        assert len(runtime.copies) - before == misses * len(TENSORS)  # one copy per tensor
        for expert, slot in zip(experts, slots):
            for got, want in zip(slot_bytes(pool, slot), truth[layer][expert]):
                assert np.array_equal(got, want)
    pool.close()
    assert runtime.allocated == {} and runtime.queued == {}  # freed, streams destroyed


def test_a_failed_read_copies_nothing_and_lends_its_buffer_again(tmp_path):
    runtime = FakeRuntime()
    landing = StagedCopies([t.nbytes for t in TENSORS], 1, runtime)
    pool, truth = pool_over(tmp_path, slots=2, landing=landing)
    pool.layers[1].checksums = [[0, 0, 0]] * 6  # every read of layer 1 fails its checksum
    with pytest.raises(StreamerError, match="does not match its checksum"):
        pool.place(1, np.array([2]))
    assert runtime.copies == [] and pool.policy.slot_of[pool.base[1] + 2] == -1
    pool.layers[1].checksums = None
    (slot,), misses = pool.place(1, np.array([2]))  # the one buffer was given back
    assert misses == 1 and np.array_equal(slot_bytes(pool, slot)[0], truth[1][2][0])
    pool.close()


def test_a_failed_setup_releases_what_it_took():
    runtime = FakeRuntime(fail_streams_after=2)
    with pytest.raises(StreamerError, match="cudaStreamCreateWithFlags failed"):
        StagedCopies([4096], 4, runtime)
    assert runtime.allocated == {} and runtime.queued == {}


def test_staging_views_are_aligned_and_released_when_collected():
    runtime = FakeRuntime()
    landing = StagedCopies([100, 5000, 7], 2, runtime)
    with landing.into([np.zeros(n, np.uint8) for n in (100, 5000, 7)]) as views:
        assert [v.nbytes for v in views] == [100, 5000, 7]
        assert all((v.ctypes.data - views[0].ctypes.data) % STAGING_ALIGN == 0 for v in views)
    del landing, views
    assert runtime.allocated == {} and runtime.queued == {}


def test_a_cuda_error_is_one_line_with_its_name():
    class Lib:  # ctypes-like functions: attributes settable, each returns a cudaError_t
        def __getattr__(self, name):
            function = lambda *args: 2  # noqa: E731 (cudaErrorMemoryAllocation)
            function.__name__ = name
            setattr(self, name, function)
            return function

    lib = Lib()
    lib.cudaGetErrorString = lambda err: b"out of memory"
    message = r"^CUDA cudaMemcpyAsync failed: out of memory \(error 2\)$"
    with pytest.raises(StreamerError, match=message):
        CudaRuntime(lib).copy(1, 2, 3, 0)


def test_reads_are_staged_on_cuda_only():
    landing = landing_for(TENSORS, 2, True, CUDA_MISSES_DEFAULT, PinAllowance(1 << 30))
    assert (landing is not None) == (mx.default_device() == mx.gpu and mx.cuda.is_available())
    if landing is not None:
        landing.close()


class MappingRuntime(FakeRuntime):
    """A copy from a file's mapping (MappedCopies): from a range registered for it, if any."""

    def __init__(self, register: bool):
        super().__init__()
        self.registered: dict[int, int] = {}  # start: bytes, while page-locked
        self.registrations = 0
        self._must_register = register

    def register(self, address: int, nbytes: int, mapped: bool = False) -> None:
        assert address % mmap.PAGESIZE == 0 and nbytes % mmap.PAGESIZE == 0
        assert all(address + nbytes <= a or a + n <= address for a, n in self.registered.items())
        self.registered[address] = nbytes
        self.registrations += 1

    def unregister(self, address: int) -> None:
        del self.registered[address]

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        if self._must_register:
            assert any(a <= src and src + nbytes <= a + n for a, n in self.registered.items())
        self.queued[stream].append((dst, src, nbytes))


@pytest.mark.parametrize(
    "lock, pinnable", [("none", 0), ("copy", 0), ("file", 1 << 40), ("file", 1)]
)
def test_misses_are_copied_from_the_files_mappings(tmp_path, lock, pinnable):
    """cuda_misses="mapped" / "registered" / "pinned": the copy engine reads the file's mapping
    (each expert's pages locked for its copies then unlocked, or each whole file locked once
    while `pinnable` bytes allow, else per copy), and every slot gets its expert's bytes; no
    staging is allocated."""
    runtime = MappingRuntime(register=lock != "none")
    pool, truth = pool_over(
        tmp_path, slots=4, landing=MappedCopies(runtime, lock, PinAllowance(pinnable))
    )
    for layer, experts in [(0, [1, 4, 5]), (1, [0, 1, 2, 5]), (0, [2, 3, 4])]:
        slots, misses = pool.place(layer, np.array(experts))
        for expert, slot in zip(experts, slots):
            for got, want in zip(slot_bytes(pool, slot), truth[layer][expert]):
                assert np.array_equal(got, want)
    whole_files = len(runtime.registered)  # still locked between calls: whole files only
    assert whole_files == (2 if pinnable > 1 else 0) and runtime.allocated == {}
    assert runtime.registrations == {"none": 0, "copy": 10}.get(lock, 2 if pinnable > 1 else 10)
    pool.close()
    assert runtime.queued == {} and runtime.registered == {}  # stream destroyed, files unlocked


def test_the_pools_of_a_load_lock_files_within_one_allowance(tmp_path):
    """Each pool's landing was given the plan's `pinnable` as its own: a load's pools (3 at an
    8 GiB budget on the 48-layer model, more past it) could lock that many times the host
    memory the plan allows. Shared, two pools whose allowance fits one file lock one whole
    between them, and closing a pool gives its files' bytes back."""
    runtime = MappingRuntime(register=True)
    one_file = RECORD * 6  # pool_over's layer file: 6 experts
    allowance = PinAllowance(one_file)
    pools = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        landing = MappedCopies(runtime, "file", allowance)
        pools.append(pool_over(tmp_path / name, slots=4, landing=landing)[0])
        pools[-1].place(0, np.array([1, 2]))
    assert len(runtime.registered) == 1 and allowance.left == 0  # the second per copy
    pools[0].close()
    assert allowance.left == one_file and runtime.registered == {}
    pools[1].close()


def test_a_mapped_copy_checks_checksums_and_names_a_short_file(tmp_path):
    runtime = MappingRuntime(register=True)
    pool, truth = pool_over(tmp_path, slots=2, landing=MappedCopies(runtime, "copy"))
    pool.layers[1].checksums = [[0, 0, 0]] * 6
    with pytest.raises(StreamerError, match="does not match its checksum"):
        pool.place(1, np.array([2]))
    assert pool.policy.slot_of[pool.base[1] + 2] == -1 and runtime.registered == {}
    pool.layers[1].checksums = None
    path = tmp_path / "000.bin"
    os.truncate(path, path.stat().st_size // 2)  # before layer 0 is first mapped
    with pytest.raises(StreamerError, match=r"000\.bin: cannot read expert 5 \(short read"):
        pool.place(0, np.array([5]))
    pool.close()


def test_cuda_misses_come_from_the_way_the_load_names(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_runtime, "CudaRuntime", lambda: made.append(1) or FakeRuntime())
    for way, page_cache, kind in [
        (None, True, MappedCopies),  # "gathered"
        ("staged", True, StagedCopies),
        ("gathered", False, StagedCopies),  # reads around the page cache: nothing to map
        ("mapped", True, MappedCopies),
        ("registered", True, MappedCopies),
        ("pinned", True, MappedCopies),
        ("registered", False, StagedCopies),  # reads around the page cache: staged as asked
    ]:
        misses = CUDA_MISSES_DEFAULT if way is None else way  # None: the default
        landing = landing_for(TENSORS, 2, page_cache, misses, 1 << 30)
        assert type(landing) is kind
        lock = {"mapped": "none", "registered": "copy", "pinned": "file", None: "file"}.get(way)
        assert getattr(landing, "_lock", None) == (lock if page_cache else None)
        assert getattr(landing, "gathers", False) == (way is None and page_cache)
        landing.close()
    with pytest.raises(StreamerError, match="cuda_misses must be one of staged, mapped"):
        load_options(cuda_misses="fast")  # refused with the load's other options, not here


def test_a_pool_on_cuda_moves_its_pages_to_the_gpu_once(monkeypatch):
    """On a CUDA GPU the pool's managed pages are prefetched to the device when allocated (the
    whole buffer, in one call): else they count in the process's RSS and fault over one at a
    time. Elsewhere nothing is called."""
    from streamer.cache import slot_memory

    moved = []

    class Moves:
        def to_device(self, address: int, nbytes: int) -> None:
            moved.append((address, nbytes))

    monkeypatch.setattr(cuda_runtime, "CudaRuntime", Moves)
    tensor = TENSORS[0]
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.cpu))
    slot_memory.allocate(3, tensor)
    assert moved == []  # not computing on a CUDA GPU
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        slot_memory.buffers, "untouched", lambda n: mx.zeros((-(-n // 4096), 4096), mx.uint8)
    )
    _, rows = slot_memory.allocate(3, tensor)
    ((address, nbytes),) = moved
    assert address <= rows.ctypes.data and rows.ctypes.data + rows.nbytes <= address + nbytes


def test_the_prefetch_names_the_current_gpu_and_waits():
    calls = []

    class Lib:
        def __getattr__(self, name):
            def function(*args):
                calls.append((name, args))
                if name == "cudaGetDevice":
                    args[0]._obj.value = 3
                if name == "cudaStreamCreateWithFlags":
                    args[0]._obj.value = 77
                return 0

            function.__name__ = name
            setattr(self, name, function)
            return function

    CudaRuntime(Lib()).to_device(4096, 8192)
    names = [name for name, _ in calls]
    assert names == [
        "cudaGetDevice",
        "cudaStreamCreateWithFlags",
        "cudaMemPrefetchAsync",
        "cudaStreamSynchronize",
        "cudaStreamDestroy",
    ]
    address, nbytes, where, flags, stream = calls[2][1]
    assert (address, nbytes, where.type, where.id, flags, stream) == (4096, 8192, 1, 3, 0, 77)
