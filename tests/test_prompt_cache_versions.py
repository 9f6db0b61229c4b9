"""--prompt-cache-dir files say the version of the format they were written in: a later
streamer's files (sharing the folder) are left to it, never read as this one's; a version no
streamer writes is a damaged file; files written before there were versions are version 1."""

from __future__ import annotations

import logging

import mlx.core as mx
import pytest
from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache, save_prompt_cache
from test_prompt_cache_dir import files

import streamer
from streamer.server.disk_cache import DiskCache
from streamer.server.disk_files import PREFIX, SUFFIX, crc32
from streamer.server.disk_format import VERSION

TOKENS = [list(range(1, 21)), list(range(1, 31))]  # two turns: a file and one continuing it


@pytest.fixture(scope="module")
def local(checkpoints):
    return streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def written(model, folder) -> list:
    """The files of two turns, the second continuing the first, first to last."""
    disk, cache = DiskCache(folder, "id", 1 << 30), make_prompt_cache(model)
    for tokens in TOKENS:
        mx.eval(model(mx.array([tokens[cache[0].offset :]]), cache=cache))
        disk.save(tokens, cache)
    return [e.path for e in sorted(disk.entries.values(), key=lambda e: e.start)]


def rewritten(path, version: str | None):
    """The file at `path` (one no file continues) with its metadata's version `version` (None:
    none, as written before versions), under the name of its new crc32: its new path."""
    cache, metadata = load_prompt_cache(str(path), return_metadata=True)
    metadata.pop(VERSION, None)
    if version is not None:
        metadata[VERSION] = version
    path.unlink()
    partial = path.with_name("rewritten" + SUFFIX)
    save_prompt_cache(str(partial), cache, metadata)
    key = path.name.removeprefix(PREFIX).split("-")[0]
    return partial.rename(path.with_name(f"{PREFIX}{key}-{crc32(partial):08x}{SUFFIX}"))


def test_files_say_their_version_and_those_without_one_are_read(local, tmp_path):
    """Files written before versions (today's chains, and the first format's whole files:
    tests/test_prompt_cache_chain.py) are read as version 1."""
    model, _ = local
    first, second = written(model, tmp_path)
    for path in (first, second):
        assert load_prompt_cache(str(path), return_metadata=True)[1][VERSION] == "1"
    rewritten(second, None)
    assert DiskCache(tmp_path, "id", 1 << 30).fetch(TOKENS[1] + [5], 0)[1] == 30


@pytest.mark.parametrize("version", ["2", "9" * 5000], ids=["next", "huge"])
def test_a_later_streamers_file_is_left_to_it(local, tmp_path, caplog, version):
    """A file of a later version was read as this streamer's, whatever that version's keys
    meant: its caches computed with."""
    model, _ = local
    first, second = written(model, tmp_path)
    later = rewritten(second, version)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        disk = DiskCache(tmp_path, "id", 1 << 30)
    assert disk.fetch(TOKENS[1] + [5], 0)[1] == 20  # the first file's only
    assert files(tmp_path) == sorted([first, later])
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"ignoring prompt cache {later} (format version {version[:9]}")
    assert said.endswith("; left in place") and "9" * 300 not in said  # shortened


@pytest.mark.parametrize("version", ["1.5", "abc", "", "0", "-1", "01", " 1"])
def test_a_version_no_streamer_writes_is_a_damaged_file(local, tmp_path, caplog, version):
    model, _ = local
    first, second = written(model, tmp_path)
    bad = rewritten(second, version)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        disk = DiskCache(tmp_path, "id", 1 << 30)
    assert list(disk.entries) == [first] and files(tmp_path) == [first]
    said = f"ignoring damaged prompt cache {bad} (its format version {version!r} is not"
    assert said in caplog.text
