"""Experts computed in place on the mapped expert files: no copy, the page cache is the memory."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import reference_model
from test_parity import PROMPT, greedy_tokens

import streamer
from streamer.errors import StreamerError
from streamer.expert_traffic import UNSETTLED_MAX, ExpertTraffic
from streamer.experts import RECHECK_CALLS
from streamer.experts.mapped import Prefetcher
from streamer.io.expert_files import ExpertFiles
from streamer.io.expert_layout import ByteRange, LayerLayout, Strided, TensorPlacement
from streamer.io.mapping import OS_PAGE, MappedFile
from streamer.run_stats import settled


def mapped_kib(path) -> int:
    """KiB of `path`'s pages this process has mapped (/proc/self/smaps)."""
    total, ours = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        field = line.split(maxsplit=1)[0]
        if not field.endswith(":"):  # a mapping's first line: its range, ..., its file
            ours = line.endswith(str(path))
        elif ours and field == "Rss:":
            total += int(line.split()[1])
    return total


def test_mapped_file_is_the_page_cache_not_a_copy(tmp_path):
    path = tmp_path / "experts.bin"
    path.write_bytes(bytes(range(256)) * (3 * OS_PAGE // 256))
    fd = os.open(path, os.O_RDWR)
    try:
        mapped = MappedFile(fd, 3 * OS_PAGE)
        array = mapped.view(0, mx.uint8, (3 * OS_PAGE,), (1,))
        assert mx.array_equal(array[:256], mx.arange(256, dtype=mx.uint8))
        os.pwrite(
            fd, b"\x07" * 16, OS_PAGE + 5
        )  # a write to the file shows through: the array is its pages
        assert array[OS_PAGE + 5 : OS_PAGE + 21].tolist() == [7] * 16
        assert mapped.host[OS_PAGE + 5] == 7 and not mapped.host.flags.writeable
        view = array[:OS_PAGE] + 0  # computed lazily, after the file is closed
        mapped.close()
    finally:
        os.close(fd)
    if os.path.exists("/proc/self/smaps"):  # closing gave the pages back; the buffer lives on
        assert mapped_kib(path) == 0
    # an array computed from the buffer after its owner closed reads the file's bytes, not zeros
    assert view[:256].tolist() == list(range(256))
    del view, array, mapped
    # freed, the buffer is ordinary memory that MLX may recycle: writes land on private copies
    fresh = [mx.ones((3 * OS_PAGE,), dtype=mx.uint8) for _ in range(4)]
    assert all(mx.sum(a).item() == 3 * OS_PAGE for a in fresh)
    assert path.read_bytes()[:256] == bytes(range(256))  # the file is untouched


@pytest.mark.parametrize("kind", ["hf float32", "mlx 4-bit float32 scales"])
def test_experts_are_computed_in_place_when_the_stored_dtype_is_the_compute_dtype(
    checkpoints, kind
):
    """On CPU streamer computes in float32: float32 checkpoints need no conversion, so the
    kernels read the routed experts straight from the mapped files (0 bytes copied)."""
    src = (
        checkpoints.hf("qwen3_moe", dtype="float32")
        if kind == "hf float32"
        else checkpoints.mlx("qwen3_moe", dtype="float32")
    )
    folder = checkpoints.repacked(src)
    for file in (folder / "experts").iterdir():  # all in the page cache, whichever test (or
        file.read_bytes()  # process: the checkpoints are shared) wrote or dropped them
    model, tokenizer = streamer.load(folder, memory_budget=0)
    reference = reference_model(src)
    prompt = mx.array(tokenizer.encode(PROMPT))
    assert mx.allclose(model(prompt[None]), reference(prompt[None]), atol=1e-5, rtol=0)
    assert greedy_tokens(model, prompt, 32) == greedy_tokens(reference, prompt, 32)
    decode = model.streamer.stats.decode
    assert decode.experts_read > 0 and decode.bytes_read > 0
    assert decode.bytes_copied == 0
    # the files are all in the page cache: no layer needs a sync
    assert decode.syncs == 0 and decode.experts_fetched == 0 and decode.page_cache_hit_rate == 1.0


def test_streamed_pieces_count_sync_free_calls_only_at_the_end(checkpoints):
    """Counting a sync-free call pulls its routing, which waits for the token mlx-lm has in
    flight: each streamed piece but the last leaves such calls uncounted, the last counts all of
    them, as a read of the stats after the run does, and a long run keeps a bounded list."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe", dtype="float32"))
    for file in (folder / "experts").iterdir():  # all in the page cache: no layer syncs
        file.read_bytes()
    model, tokenizer = streamer.load(folder, memory_budget=0)
    stats = model.streamer.stats
    waiting, pieces = [], []
    for piece in streamer.stream_generate(model, tokenizer, PROMPT, max_tokens=8):
        waiting.append(len(stats.unsettled))
        pieces.append(piece)
    assert min(waiting[:-1]) > 0 and stats.unsettled == []  # the last piece settled them
    piece = pieces[-1]
    after = settled(model, piece.stats)
    for figure in ("expert_bytes_per_token", "expert_reads_per_token", "prefill_expert_bytes"):
        assert getattr(piece.stats, figure) == getattr(after, figure)
    assert piece.stats.expert_reads_per_token > 0 and piece.stats.syncs_per_token == 0
    traffic, routed = ExpertTraffic(), mx.array([[3, 1, 3]])
    for _ in range(UNSETTLED_MAX + 1):
        stats.defer(traffic, routed, 10, 4)
    assert len(stats.unsettled) <= UNSETTLED_MAX
    counted = UNSETTLED_MAX + 1 - len(stats.unsettled)  # the oldest, two experts each
    assert traffic.experts_read == 2 * counted and traffic.bytes_read == 20 * counted


def test_converted_experts_are_copied_once(checkpoints):
    """bf16 scales on CPU are widened to float32: only the routed experts are copied, per call."""
    model, tokenizer = streamer.load(
        checkpoints.repacked(checkpoints.mlx("qwen3_moe")), memory_budget=0
    )
    greedy_tokens(model, mx.array(tokenizer.encode(PROMPT)), 8)
    decode = model.streamer.stats.decode
    assert decode.bytes_copied == decode.bytes_read > 0


@pytest.mark.skipif(
    not hasattr(os, "posix_fadvise"),
    reason="dropping one file's page cache needs posix_fadvise (Linux)",
)
def test_cold_experts_are_fetched_then_computed_identically(checkpoints):
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe", dtype="float32"))
    model, tokenizer = streamer.load(folder, memory_budget=0)
    prompt = mx.array(tokenizer.encode(PROMPT))
    warm = np.array(model(prompt[None]))

    def drop() -> None:
        model.streamer.files.evict()  # pages this process maps are skipped by fadvise
        for layer in model.streamer.manifest.layers:
            fd = os.open(folder / layer.file, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)

    drop()
    model.streamer.stats.reset()
    cold = np.array(model(prompt[None]))
    prefill = model.streamer.stats.prefill
    assert np.array_equal(cold, warm)
    assert prefill.syncs == prefill.layer_calls  # cold files: each layer learns its routing first
    assert prefill.experts_fetched > 0  # one WILLNEED per cold routed expert
    assert prefill.bytes_in_page_cache < prefill.bytes_measured
    # once every expert has been fetched, the files are whole in the page cache again: no syncs
    everything = mx.array(
        [list(range(model.streamer.manifest.layers[0].num_experts))], dtype=mx.uint32
    )
    for layer in model.model.layers:
        layer.mlp.switch_mlp(mx.zeros((1, 1, model.args.hidden_size)), everything)
    for _ in range(
        2 * RECHECK_CALLS
    ):  # a check right after misses says no; the next one asks the OS
        mx.eval(model(prompt[None]))
    model.streamer.stats.reset()
    assert np.array_equal(np.array(model(prompt[None])), warm)
    assert model.streamer.stats.prefill.syncs == 0


def test_mapped_files_do_not_count_against_mlx_memory_limit(checkpoints):
    """MLX counts mapped files as active memory; past its limit it would run op by op."""
    before = mx.get_memory_limit()
    model, _ = streamer.load(
        checkpoints.repacked(checkpoints.mlx("qwen3_moe", dtype="float32")), memory_budget=0
    )
    handle = model.streamer
    mapped = handle.mapped_mlx_bytes
    assert mapped > 0 and mx.get_memory_limit() == before + mapped
    handle.close()
    assert mx.get_memory_limit() == before


def test_an_expert_may_be_several_byte_ranges_in_several_files(tmp_path):
    """A layout as an MLX download keeps experts: each tensor stacked [E, ...] where it lies in
    its own file. Views read each expert's slice in place; residency, read-ahead and checksums
    work per range."""
    a = np.arange(4 * 3 * 8, dtype=np.float32).reshape(4, 3, 8)
    b = (np.arange(4 * 5, dtype=np.int32) * 7).reshape(4, 5)
    paths = (tmp_path / "a.bin", tmp_path / "b.bin")
    paths[0].write_bytes(bytes(64) + a.tobytes())  # the stacked tensor starts after a header
    paths[1].write_bytes(b.tobytes())
    ranges = (Strided(0, 64, a[0].nbytes, a[0].nbytes), Strided(1, 0, b[0].nbytes, b[0].nbytes))
    layout = LayerLayout(
        folder=tmp_path,
        index=0,
        module="model.layers.0.mlp.switch_mlp",
        files=paths,
        file_bytes=tuple(p.stat().st_size for p in paths),
        num_experts=4,
        tensors=(
            TensorPlacement("gate_proj.weight", mx.float32, (3, 8), ranges[0]),
            TensorPlacement("up_proj.weight", mx.int32, (5,), ranges[1]),
        ),
        expert_ranges=ranges,
        payload_bytes=a[0].nbytes + b[0].nbytes,
        regions=(ByteRange(0, 64, a.nbytes), ByteRange(1, 0, b.nbytes)),
    )
    files = ExpertFiles([layout])
    layer = files.layers[0]
    assert np.array_equal(np.array(layer.views[0]), a) and np.array_equal(
        np.array(layer.views[1]), b
    )
    assert layer.ranges(2) == [
        ByteRange(0, 64 + 2 * a[0].nbytes, a[0].nbytes),
        ByteRange(1, 2 * b[0].nbytes, b[0].nbytes),
    ]
    crcs = [(zlib.crc32(a[e].tobytes()), zlib.crc32(b[e].tobytes())) for e in range(4)]
    prefetcher = Prefetcher(files, layer, crcs)
    traffic = ExpertTraffic()
    prefetcher.fetch([1, 3], traffic)
    assert traffic.experts_read == 2 and traffic.bytes_read == 2 * layout.payload_bytes
    assert traffic.bytes_measured in (0, 2 * layout.payload_bytes)  # 0: the OS cannot tell
    assert traffic.bytes_in_page_cache == traffic.bytes_measured  # just written: all cached
    assert prefetcher.file_in_page_cache()
    fd = os.open(paths[1], os.O_RDWR)
    os.pwrite(fd, b"\xff", 2 * b[0].nbytes + 1)  # expert 2 of the second tensor rots
    os.close(fd)
    with pytest.raises(StreamerError, match=r"b.bin \(MoE layer 0, .*\): expert 2 tensor up_proj"):
        prefetcher.fetch([2], traffic)
    files.close()
