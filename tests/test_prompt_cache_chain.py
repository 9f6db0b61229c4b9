"""--prompt-cache-dir's files as chains: a conversation's turn writes the KV of its new tokens
only (each turn's file held the whole conversation, so a chat's writes grew with the square of its
length), every cache type mlx-lm makes for streamer's families comes back from a chain as it was,
an interrupted or broken chain is never used past its last whole file, and the first format's
files are still read."""

from __future__ import annotations

import copy
import json
import logging
import stat

import mlx.core as mx
import pytest
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache, save_prompt_cache
from test_prompt_cache_dir import SYSTEM, engine_over, files, interrupt_saves

import streamer
from streamer.server.api import Completion, Sampling
from streamer.server.disk_cache import PREFIX, DiskCache
from streamer.server.disk_entries import model_identity
from streamer.server.disk_files import crc32
from streamer.server.disk_segments import layout
from streamer.server.jobs import Done, Job
from streamer.server.prompts import prompt_tokens

QUANTIZED = {"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 0}


@pytest.fixture(scope="module")
def local(checkpoints):
    return streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def turn(engine, messages: list[dict], text: str) -> tuple[list[int], Done]:
    """One chat turn, as `streamer chat` sends it: the whole conversation, the answer kept."""
    messages.append({"role": "user", "content": text})
    request = Completion(True, "m", None, Sampling(), messages=messages)
    prompt = prompt_tokens(request, engine.tokenizer)
    job = engine.submit(Job(request, prompt, 8))
    pieces = []
    while not isinstance(event := job.events.get(timeout=120), Done):
        pieces.append(event.piece.content)
    engine.wait_kept()
    messages.append({"role": "assistant", "content": "".join(pieces)})
    return prompt, event


def test_a_chat_turn_writes_its_new_tokens_only(local, tmp_path):
    model, tokenizer = local
    engine = engine_over(local, tmp_path)
    messages, written, seen = [{"role": "system", "content": SYSTEM}], [], set()
    for i in range(6):
        turn(engine, messages, f"question {i}: what does line {i} do?")
        new = [p for p in files(tmp_path) if p not in seen]
        written.append(sum(p.stat().st_size for p in new))
        seen.update(new)
    # each turn adds about 60 tokens: turn 6 wrote as much as turn 2 (it wrote twice as much)
    assert written[-1] < 1.5 * written[1] < written[0]
    assert {stat.S_IMODE(p.stat().st_mode) for p in files(tmp_path)} == {0o600}
    # a restarted chat starts from the chain, with the text of the whole prompt computed
    messages.append({"role": "user", "content": "and then?"})
    request = Completion(True, "m", None, Sampling(), messages=messages)
    prompt = prompt_tokens(request, tokenizer)
    want = streamer.generate(model, tokenizer, prompt, 8)
    messages.pop()
    _, done = turn(engine_over(local, tmp_path), messages, "and then?")
    assert messages[-1]["content"] == want and done.cached_tokens > len(prompt) // 2


def caches(model, kind: str) -> list:
    if kind == "quantized":
        return [QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]
    return make_prompt_cache(model)


def fed(model, cache: list, tokens: list[int]) -> mx.array:
    """The last logits of `tokens` computed into `cache`."""
    logits = model(mx.array([tokens]), cache=cache)[0, -1]
    mx.eval(logits)
    return logits


@pytest.mark.parametrize(
    "arch, kind, classes",
    [
        ("qwen3_moe", "plain", {"KVCache"}),
        ("qwen3_moe", "quantized", {"QuantizedKVCache"}),
        ("gpt_oss", "plain", {"KVCache", "RotatingKVCache"}),
        ("qwen3_5_moe", "plain", {"KVCache", "ArraysCache"}),
        ("deepseek_v32", "plain", {"CacheList(KVCache", "KVCache)"}),
    ],
)
def test_every_cache_type_comes_back_from_a_chain(checkpoints, tmp_path, arch, kind, classes):
    model, _ = streamer.load(checkpoints.repacked(checkpoints.hf(arch)))
    cache = caches(model, kind)
    first, second = list(range(1, 41)), list(range(50, 70))
    disk = DiskCache(tmp_path, "id", 1 << 30)
    fed(model, cache, first)
    disk.save(first, cache)
    fed(model, cache, second)
    disk.save(first + second, cache)
    assert set(layout(cache).split(",")) == classes
    (ended,) = [e for e in disk.entries.values() if e.end == 60]
    assert ended.start == 40 and ended.parent is not None  # its file holds the 20 new tokens
    kept = copy.deepcopy(cache)
    loaded, held = DiskCache(tmp_path, "id", 1 << 30).fetch(first + second + [3], 0)
    assert held == 60
    assert mx.array_equal(fed(model, loaded, [3]), fed(model, kept, [3]))


def chain(model, folder) -> tuple[DiskCache, list[list[int]]]:
    """Three turns' files, each continuing the one before."""
    disk, cache = DiskCache(folder, "id", 1 << 30), make_prompt_cache(model)
    turns = [list(range(1, 21)), list(range(1, 31)), list(range(1, 41))]
    for tokens in turns:
        fed(model, cache, tokens[cache[0].offset :])
        disk.save(tokens, cache)
    assert [e.start for e in sorted(disk.entries.values(), key=lambda e: e.start)] == [0, 20, 30]
    return disk, turns


def by_length(disk: DiskCache) -> list:
    return [e.path for e in sorted(disk.entries.values(), key=lambda e: e.end)]


def test_an_interrupted_turn_leaves_the_chain_before_it(local, tmp_path, monkeypatch):
    model, _ = local
    disk, turns = chain(model, tmp_path)
    before = files(tmp_path)
    interrupt_saves(monkeypatch)
    cache = make_prompt_cache(model)
    fed(model, cache, list(range(1, 51)))
    with pytest.raises(KeyboardInterrupt):
        disk.save(list(range(1, 51)), cache)
    monkeypatch.undo()
    assert files(tmp_path) == before  # the partial file is no cache file
    assert DiskCache(tmp_path, "id", 1 << 30).fetch(list(range(1, 51)), 0)[1] == 40


def test_a_chain_past_a_damaged_or_missing_file_is_never_used(local, tmp_path, caplog):
    model, _ = local
    disk, turns = chain(model, tmp_path)
    first, middle, last = by_length(disk)
    data = bytearray(middle.read_bytes())
    data[-5] ^= 0xFF
    middle.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        assert DiskCache(tmp_path, "id", 1 << 30).fetch(turns[2], 0) is None
    assert "crc32 does not match" in caplog.text and files(tmp_path) == [first]
    # a chain whose middle file is gone: the files after it are removed at start, named
    disk, turns = chain(model, tmp_path)
    first, middle, last = by_length(disk)
    middle.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        disk = DiskCache(tmp_path, "id", 1 << 30)
    assert by_length(disk) == [first] and files(tmp_path) == [first]
    assert f"{last} (the file it continues is gone or not its own); removed" in caplog.text


def test_a_file_of_the_first_format_is_still_read(local, tmp_path):
    """Files written before chains (whole caches, their tokens and model under other keys) are
    used as they were; a later turn writes a whole file, and the old one, its prefix, goes."""
    model, tokenizer = local
    identity = model_identity(model, {})
    text = SYSTEM + "import os"
    tokens = tokenizer.encode(text)[:100]
    cache = make_prompt_cache(model)
    fed(model, cache, tokens)
    old = {
        "streamer_model": identity,
        "streamer_tokens": json.dumps(tokens),
        "streamer_trimmable": "True",
    }
    partial = tmp_path / "old.safetensors"
    save_prompt_cache(str(partial), cache, old)
    path = tmp_path / f"{PREFIX}{'0' * 24}-{crc32(partial):08x}.safetensors"
    partial.rename(path)
    want = streamer.generate(model, tokenizer, text, 6)
    engine = engine_over(local, tmp_path)
    request = Completion(False, "m", 6, Sampling(), text=text)
    job = engine.submit(Job(request, tokenizer.encode(text), 6))
    pieces = []
    while not isinstance(event := job.events.get(timeout=120), Done):
        pieces.append(event.piece.content)
    engine.wait_kept()
    assert "".join(pieces) == want and event.cached_tokens == len(tokens)
    (entry,) = engine.disk.entries.values()
    assert entry.start == 0 and entry.parent is None and not path.exists()


def test_chains_that_loop_or_start_past_their_parent_are_left_out(tmp_path):
    """Headers a damaged or planted file could give: each left out, never joined."""
    from streamer.server.disk_entries import Entry, chained

    a, b, c, d = (tmp_path / f"{PREFIX}{name}-0.safetensors" for name in "abcd")
    headers = {
        a: Entry(a, (1, 2), True, 0, None, "KVCache"),
        b: Entry(b, (3,), True, 5, a, "KVCache"),  # starts past the 2 tokens its parent holds
        c: Entry(c, (4,), True, 1, d, "KVCache"),  # c and d continue each other
        d: Entry(d, (5,), True, 1, c, "KVCache"),
    }
    assert chained(headers) == {a: headers[a]}
