"""Residency asked of the OS for many ranges at once gives what asking for each range gives."""

from __future__ import annotations

import ctypes
import mmap
import os

import mlx.core as mx
import numpy as np
import pytest

from streamer.expert_traffic import ExpertTraffic
from streamer.experts.mapped import Prefetcher
from streamer.io.expert_files import ExpertFiles
from streamer.io.expert_layout import ByteRange, LayerLayout, Strided, TensorPlacement
from streamer.io.mapping import OS_PAGE, MappedFile, Residency, _mincore, libc, page_span

pytestmark = pytest.mark.skipif(_mincore is None, reason="this libc has no mincore")
PAGES = 100


def one_range(address: int, length: int) -> int:
    """The reference: one mincore call for one range, its resident pages counted in Python."""
    start = address - address % OS_PAGE
    pages = -(-(address + length - start) // OS_PAGE)
    vec = (ctypes.c_ubyte * pages)()
    assert _mincore(start, address + length - start, vec) == 0
    resident = sum(v & 1 for v in vec)
    return length if resident == pages else min(resident * OS_PAGE, length)


def asked(residency: Residency, addresses, lengths) -> np.ndarray:
    spans = [page_span(int(a), int(n)) for a, n in zip(addresses, lengths)]
    return residency.resident_bytes(spans, np.array(lengths))


def partly_cached(path, pages: int, cached: list[int]):
    """A file of `pages` holes, of which only the pages `cached` were read into the page cache."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, pages * OS_PAGE)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead around what is read
    for page in cached:
        os.pread(fd, 1, page * OS_PAGE)
    return fd


def test_many_ranges_at_once_count_as_each_range_alone(tmp_path):
    rng = np.random.default_rng(0)
    fds, maps = [], []
    for name in ("a", "b"):  # ranges in two mappings, asked together
        cached = sorted(rng.choice(PAGES, PAGES // 3, replace=False).tolist())
        fds.append(partly_cached(tmp_path / name, PAGES, cached))
        maps.append(MappedFile(fds[-1], PAGES * OS_PAGE))
    try:
        residency = Residency()
        for _ in range(40):  # overlapping, adjacent, unaligned, near and far apart, one page
            n = int(rng.integers(1, 30))
            mapping = rng.integers(0, 2, n)  # in either file
            lengths = rng.integers(1, 6 * OS_PAGE, n)
            offsets = rng.integers(0, PAGES * OS_PAGE - lengths)
            addresses = np.array([maps[m].address for m in mapping]) + offsets
            want = [one_range(int(a), int(n)) for a, n in zip(addresses, lengths)]
            got = asked(residency, addresses, lengths)
            assert got.tolist() == want
        edges = [(0, OS_PAGE), (0, OS_PAGE + 1), (OS_PAGE - 1, 2), (OS_PAGE - 1, 1), (5, 1)]
        edges += [(p * OS_PAGE, 1) for p in range(PAGES)] + [(p * OS_PAGE - 1, 2) for p in (1, 7)]
        addresses = np.array([maps[0].address + offset for offset, _ in edges])
        lengths = np.array([n for _, n in edges])
        want = [one_range(int(a), int(n)) for a, n in zip(addresses, lengths)]
        assert asked(residency, addresses, lengths).tolist() == want
        everything = [m.address for m in maps], [PAGES * OS_PAGE] * 2
        whole = asked(residency, *everything).tolist()
        assert 0 < whole[0] < PAGES * OS_PAGE and whole == [one_range(*r) for r in zip(*everything)]
    finally:
        for m in maps:
            m.close()
        for fd in fds:
            os.close(fd)


def test_no_call_spans_the_gap_between_two_mappings():
    """Two ranges with nothing mapped between them: a call spanning both would fail on the
    hole (ENOMEM)."""
    anonymous = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    base = libc.mmap(None, 3 * OS_PAGE, mmap.PROT_READ | mmap.PROT_WRITE, anonymous, -1, 0)
    assert libc.munmap(ctypes.c_void_p(base + OS_PAGE), OS_PAGE) == 0
    try:
        ctypes.memset(base, 1, 1)  # page 0 resident, page 2 never touched
        counts = asked(Residency(), [base, base + 2 * OS_PAGE], [OS_PAGE, OS_PAGE])
        assert counts.tolist() == [OS_PAGE, 0]
    finally:
        libc.munmap(ctypes.c_void_p(base), OS_PAGE)
        libc.munmap(ctypes.c_void_p(base + 2 * OS_PAGE), OS_PAGE)


def test_a_download_layout_counts_its_routed_ranges_as_before(tmp_path):
    """Nine ranges per expert in nine mappings (a quantized GLU in a download), some experts
    partly cached: the traffic counts each range's resident bytes and one fetch per cold expert,
    and only cold ranges are announced."""
    experts, tensors = 16, 9
    nbytes = [int(n) for n in np.random.default_rng(1).integers(OS_PAGE // 3, 3 * OS_PAGE, tensors)]
    paths = [tmp_path / f"t{i}.bin" for i in range(tensors)]
    header = 100  # stacked tensors start anywhere in a shard
    ranges = tuple(Strided(i, header, n, n) for i, n in enumerate(nbytes))
    for path, n in zip(paths, nbytes):  # experts 0-2 cached, 9 in part, the rest not
        warm = list(range((header + 3 * n) // OS_PAGE + 1)) + [(header + 9 * n) // OS_PAGE]
        os.close(partly_cached(path, -(-(header + experts * n) // OS_PAGE), warm))
    layout = LayerLayout(
        folder=tmp_path,
        index=0,
        module="model.layers.0.mlp.switch_mlp",
        files=tuple(paths),
        file_bytes=tuple(p.stat().st_size for p in paths),
        num_experts=experts,
        tensors=tuple(
            TensorPlacement(f"t{i}.weight", mx.uint8, (n,), r)
            for i, (n, r) in enumerate(zip(nbytes, ranges))
        ),
        expert_ranges=ranges,
        payload_bytes=sum(nbytes),
        regions=tuple(ByteRange(i, header, experts * n) for i, n in enumerate(nbytes)),
    )
    files = ExpertFiles([layout])
    layer = files.layers[0]
    try:
        routed = [1, 2, 5, 9, 15]
        each = [
            [one_range(layer.address(r.file, r.offset), r.length) for r in layer.ranges(e)]
            for e in routed
        ]
        assert np.array_equal(layer.resident_bytes(routed), each)
        assert layer.resident_bytes([1, 2]).tolist() == [nbytes, nbytes]  # all cached
        announced = []
        layer.advise = lambda r, advice: announced.append((r, advice))
        traffic = ExpertTraffic()
        Prefetcher(files, layer, None).fetch(routed, traffic)
        cold = [
            (r, mmap.MADV_WILLNEED)
            for e, counts in zip(routed, each)
            for r, count in zip(layer.ranges(e), counts)
            if count < r.length
        ]
        assert cold and announced == cold
        assert traffic.bytes_in_page_cache == sum(map(sum, each))
        assert traffic.bytes_measured == len(routed) * sum(nbytes)
        assert traffic.experts_fetched == sum(any(c < n for c, n in zip(e, nbytes)) for e in each)
        assert 0 < traffic.experts_fetched < len(routed)
    finally:
        files.close()
