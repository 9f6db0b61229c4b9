"""--prompt-cache-dir holding files another program, another streamer, a crashed run or a hand
wrote under the cache's names, each checked as much as its name and header allow (crc32, model
identity, tokens, layout): one that passes those checks but holds what this model cannot compute
with is removed with one log line, and the prompt is computed as without it. Files the cache did
not write are left alone; those it cannot change or remove cost the cache only."""

from __future__ import annotations

import errno
import json
import logging
import os
import struct
from pathlib import Path

import mlx.core as mx
import pytest
from hostile_files import flip_byte
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache
from test_prompt_cache_dir import SYSTEM, ask, engine_over, files

import streamer
from streamer.server.disk_files import PARTIAL, PREFIX, SUFFIX, crc32
from streamer.server.disk_segments import layout


@pytest.fixture(scope="module")
def local(checkpoints):
    return streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def planted(path, change, **said: str) -> None:
    """Replace the cache file at `path` by one whose caches `change` edited, its header's
    metadata kept but for `said` (its layout said anew) and its name giving its own crc32: every
    check of the name and header passes."""
    cache, metadata = load_prompt_cache(str(path), return_metadata=True)
    change(cache)
    metadata.update(said, streamer_layout=layout(cache))
    path.unlink()
    partial = path.with_name("planted" + SUFFIX)
    save_prompt_cache(str(partial), cache, metadata)
    partial.rename(path.with_name(f"{PREFIX}{'0' * 24}-{crc32(partial):08x}{SUFFIX}"))


def one_head(cache):
    for layer in cache:
        layer.keys, layer.values = layer.keys[:, :1], layer.values[:, :1]


def two_sequences(cache):
    for layer in cache:
        layer.keys, layer.values = (mx.concatenate([a, a]) for a in (layer.keys, layer.values))


def integer_keys(cache):
    for layer in cache:
        layer.keys, layer.values = ((a * 100).astype(mx.int32) for a in (layer.keys, layer.values))


@pytest.mark.parametrize(
    "change",
    [one_head, two_sequences, integer_keys, lambda cache: cache.pop()],
    ids=["one-head", "two-sequences", "integer-keys", "a-layer-short"],
)
def test_a_file_this_model_cannot_compute_with_is_removed(local, tmp_path, caplog, change):
    """Each failed every request it matched (a 500, generation failed), kept for the next one;
    integer keys gave another answer."""
    model, tokenizer = local
    text = SYSTEM + "import os"
    want = streamer.generate(model, tokenizer, text, 6)
    ask(engine_over(local, tmp_path), text)
    (path,) = files(tmp_path)
    planted(path, change)
    (bad,) = files(tmp_path)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        answer, done = ask(engine_over(local, tmp_path), text)
    assert answer == want and done.cached_tokens == 0
    assert f"ignoring damaged prompt cache {bad} (" in caplog.text and not bad.exists()


def test_a_file_saying_it_cuts_back_where_it_cannot_is_removed(local, tmp_path, caplog):
    """A header saying "True" for a sliding window past its size (chat's --max-kv-size): cut
    back to a shorter prompt's prefix, mlx-lm cut nothing, and the answer came from a cache
    holding tokens the prompt has not."""
    model, tokenizer = local
    window = {"max_kv_size": 8}
    ask(engine_over(local, tmp_path, options=window), SYSTEM + "import os")
    (path,) = files(tmp_path)
    planted(path, lambda cache: None, streamer_trimmable="True")
    (bad,) = files(tmp_path)
    text = SYSTEM + "def main():"
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        answer, done = ask(engine_over(local, tmp_path, options=window), text)
    assert answer == streamer.generate(model, tokenizer, text, 6, **window)
    assert done.cached_tokens == 0 and f"damaged prompt cache {bad} (" in caplog.text


def test_files_the_cache_did_not_write_are_left_alone(local, tmp_path):
    """Files under names near the cache's (a user's notes or weights kept beside the caches)
    were removed: at start as damaged caches, by the bound as the least recently used ones, or
    as a gone process's partial write."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    mine = {
        f"{PREFIX}notes{SUFFIX}": b"",
        f"{PREFIX}weights{SUFFIX}": struct.pack("<Q", len(header)) + header + bytes(4),
        f"{PREFIX}{'0' * 24}-00000000.safetensors.bak": b"",
        f"{PARTIAL}999999999-notes.txt": b"",
    }
    for name, data in mine.items():
        (tmp_path / name).write_bytes(data)
    ask(engine_over(local, tmp_path), "import os")
    (size,) = {p.stat().st_size for p in files(tmp_path) if p.name not in mine}
    ask(engine_over(local, tmp_path, max_bytes=size + size // 2), "import sys")  # one fits
    assert {name: (tmp_path / name).read_bytes() for name in mine} == mine


def test_a_file_longer_than_its_header_says_is_not_read_through(local, tmp_path, caplog):
    """A cache file grown sparse past its arrays (a copy or tool gone wrong) had its whole length
    read for its crc32 before anything else: hours for terabytes, the request waiting."""
    model, tokenizer = local
    ask(engine_over(local, tmp_path), "import os")
    (path,) = files(tmp_path)
    size = path.stat().st_size
    os.truncate(path, 1 << 30)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        answer, done = ask(engine_over(local, tmp_path), "import os")
    assert answer == streamer.generate(model, tokenizer, "import os", 6) and done.cached_tokens == 0
    assert f"{path} (it is 1073741824 bytes, and its header says {size}); removed" in caplog.text


def unchangeable(monkeypatch, folder) -> None:
    """The files in `folder` cannot be removed nor their times set, as where they are another
    user's in a sticky folder, immutable (chattr +i), or the disk was remounted read-only."""
    real_unlink, real_utime = Path.unlink, os.utime

    def denied(path) -> None:
        if Path(path).parent == folder:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    def unlink(path, missing_ok=False):
        denied(path)
        real_unlink(path, missing_ok)

    def utime(path, *args, **kwargs):
        denied(path)
        real_utime(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink)
    monkeypatch.setattr(os, "utime", utime)


def test_files_the_cache_cannot_change_cost_the_cache_only(local, tmp_path, monkeypatch, caplog):
    """A file whose time could not be set failed every request it matched (PermissionError, a
    500); a damaged one that could not be removed did too, or stopped serve and chat at start
    (as a gone process's partial file did)."""
    model, tokenizer = local
    text = SYSTEM + "import os"
    want = streamer.generate(model, tokenizer, text, 6)
    ask(engine_over(local, tmp_path), text)
    (kept,) = files(tmp_path)
    junk = tmp_path / f"{PREFIX}{'1' * 24}-00000000{SUFFIX}"
    junk.write_bytes(b"x")
    dead = tmp_path / f"{PARTIAL}999999999-{'1' * 24}{SUFFIX}"
    dead.write_bytes(b"x")
    unchangeable(monkeypatch, tmp_path)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        answer, done = ask(engine_over(local, tmp_path), text)  # the kept file is used
        assert answer == want and done.cached_tokens == done.prompt_tokens - 1
        assert f"prompt cache {junk} cannot be removed (Operation not permitted)" in caplog.text
        monkeypatch.undo()
        flip_byte(kept, kept.stat().st_size - 5)
        unchangeable(monkeypatch, tmp_path)
        answer, done = ask(engine_over(local, tmp_path), text)  # damaged: not used, not removed
    assert answer == want and done.cached_tokens == 0
    assert f"prompt cache {kept} cannot be removed" in caplog.text
    assert f"damaged prompt cache {kept} (its crc32 does not match" in caplog.text
    assert "does not match its name (the file changed)); left in place" in caplog.text
    assert junk.exists() and dead.exists() and kept.exists()
    # where the files it cannot remove fill the bound, a new file is not written past it
    ask(engine_over(local, tmp_path, max_bytes=kept.stat().st_size + 100), "import sys")
    assert files(tmp_path) == sorted([junk, kept])
