"""The stats line's memory: MLX's own peak, and the process's own memory apart from the mapped
file pages the OS counts in its RSS (16.9 GiB "peak RSS" at a 2 GiB budget on CUDA was 1.1 GiB of
the process's own and the rest the experts' mapped files)."""

from __future__ import annotations

import mmap
import os
import sys

import pytest

import streamer
from streamer.io.sizes import size_text
from streamer.run_stats import memory_status, peak_rss_bytes, rss_split

PAGES = 64 << 20  # mapped file pages the process touches, far over the tiny model's own memory


@pytest.mark.skipif(sys.platform != "linux", reason="Linux's /proc splits RSS (macOS does not)")
def test_mapped_file_pages_are_shown_apart_from_the_process_own_memory(checkpoints, tmp_path):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    path = tmp_path / "mapped.bin"
    path.write_bytes(os.urandom(PAGES))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        anon_before, file_before = rss_split()
        sum(mapped[i] for i in range(0, PAGES, mmap.PAGESIZE))  # every page resident, mapped
        stats = None
        for response in streamer.stream_generate(model, tokenizer, "hello", max_tokens=3):
            stats = response.stats
        assert stats.rss_file_bytes - file_before >= PAGES * 0.9, stats
        assert stats.rss_anon_bytes - anon_before < PAGES / 4, stats  # not counted as its own
        assert stats.peak_rss_bytes >= stats.rss_anon_bytes + stats.rss_file_bytes * 0.9
        line = stats.line()
    assert f"MLX peak {size_text(stats.peak_mlx_bytes)}" in line, line
    assert " own + " in line and " mapped file pages" in line and "peak RSS" not in line, line


def test_without_the_split_the_peak_rss_says_what_it_counts(checkpoints):
    """Every streamed piece but the last skips the read (80 us here per token): its line, and a
    platform without /proc, name the peak RSS with the mapped files in it."""
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    pieces = list(streamer.stream_generate(model, tokenizer, "hello", max_tokens=3))
    assert pieces[0].stats.rss_anon_bytes is None
    assert (
        "peak RSS" in pieces[0].stats.line() and "(mapped files included)" in pieces[0].stats.line()
    )
    assert (pieces[-1].stats.rss_anon_bytes is not None) == (sys.platform == "linux")


@pytest.mark.skipif(sys.platform != "linux", reason="Linux alone resets a peak RSS")
def test_each_run_gives_its_own_peak_rss(checkpoints):
    """A server's answers each gave the process's peak RSS, the highest of every answer before:
    a spike long past stayed in every answer of a server up for days."""
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    streamer.generate(model, tokenizer, "hello", max_tokens=3)
    resident = sum(rss_split())
    spike = bytearray(4 * PAGES)  # written through: resident, then given back
    del spike
    assert memory_status()["VmHWM"] > resident + 3 * PAGES
    pieces = list(streamer.stream_generate(model, tokenizer, "hello", max_tokens=3))
    assert pieces[-1].stats.peak_rss_bytes < resident + PAGES  # the run's own, not the spike
    assert peak_rss_bytes() > resident + 3 * PAGES  # the process's, as a benchmark reports it
