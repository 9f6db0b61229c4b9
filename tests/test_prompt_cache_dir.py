"""Prompt caches on disk (--prompt-cache-dir): a restarted engine computes only what follows the
longest prefix a file holds, with the same text; damaged, foreign and interrupted files are never
used; the folder stays under its bound."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

import streamer
from streamer.server import disk_cache as disk_module
from streamer.server.api import Completion, Sampling
from streamer.server.disk_cache import PARTIAL, PREFIX, DiskCache
from streamer.server.disk_entries import model_identity
from streamer.server.engine import Engine
from streamer.server.jobs import Done, Job, Step

SYSTEM = "You write Python. " * 12  # a long shared prefix
KEY = "0" * 24  # as a cache file's name holds it (24 hex digits)


@pytest.fixture(scope="module")
def local(checkpoints):
    return streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def interrupt_saves(monkeypatch) -> None:
    """Every cache file written from now on is cut short by a Ctrl-C, part way through it."""
    real = disk_module.save_prompt_cache

    def interrupted(name, cache, metadata):
        real(name, cache, metadata)
        with open(name, "r+b") as f:
            f.truncate(100)
        raise KeyboardInterrupt

    monkeypatch.setattr(disk_module, "save_prompt_cache", interrupted)


def ask(engine: Engine, text: str, max_tokens: int = 6) -> tuple[str, Done]:
    prompt = engine.tokenizer.encode(text)
    request = Completion(False, "m", max_tokens, Sampling(), text=text)
    job = engine.submit(Job(request, prompt, max_tokens))
    pieces = []
    while not isinstance(event := job.events.get(timeout=120), Done):
        assert isinstance(event, Step), event
        pieces.append(event.piece.content)
    engine.wait_kept()  # the file is written after the answer is sent
    return "".join(pieces), event


def engine_over(local, folder, max_bytes: int = 1 << 30, options: dict | None = None) -> Engine:
    model, tokenizer = local
    disk = DiskCache(folder, model_identity(model, options or {}), max_bytes, model)
    return Engine(model, tokenizer, 2, options, disk)


def files(folder) -> list:
    return sorted(folder.glob(f"{PREFIX}*"))


def test_a_restarted_engine_starts_from_the_file(local, tmp_path):
    model, tokenizer = local
    first = SYSTEM + "import os"
    want = streamer.generate(model, tokenizer, first, 6)
    text, done = ask(engine_over(local, tmp_path), first)
    assert text == want and done.cached_tokens == 0 and len(files(tmp_path)) == 1
    # a new engine (as after a restart): nothing in memory, the file holds the prompt and answer
    text, done = ask(engine_over(local, tmp_path), first)
    assert text == want and done.cached_tokens == done.prompt_tokens - 1
    # another question after the same system prompt: the file is cut back to what is shared
    second = SYSTEM + "def main():"
    text, done = ask(engine_over(local, tmp_path), second)
    assert text == streamer.generate(model, tokenizer, second, 6)
    shared = len(os.path.commonprefix([tokenizer.encode(first), tokenizer.encode(second)]))
    assert done.cached_tokens == shared > 0


def test_files_of_another_model_or_damaged_are_not_used(local, tmp_path, caplog):
    model, tokenizer = local
    text = SYSTEM + "import os"
    ask(engine_over(local, tmp_path), text)
    # other settings are another model: the file is not theirs
    quantized = {"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 0}
    assert ask(engine_over(local, tmp_path, options=quantized), text)[1].cached_tokens == 0
    # chat's --max-kv-size: a rotating cache holds other tokens than a whole one
    assert ask(engine_over(local, tmp_path, options={"max_kv_size": 8}), text)[1].cached_tokens == 0
    for path in files(tmp_path):
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF  # one flipped bit in the cached values: the crc32 catches it
        path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        answer, done = ask(engine_over(local, tmp_path), text)
    assert answer == streamer.generate(model, tokenizer, text, 6) and done.cached_tokens == 0
    damaged = [r.getMessage() for r in caplog.records if "damaged prompt cache" in r.getMessage()]
    assert len(damaged) >= 1 and "crc32 does not match" in damaged[0]
    # a file that is not safetensors at all is named and removed at start
    (tmp_path / f"{PREFIX}{KEY}-00000000.safetensors").write_bytes(b"\xff" * 100)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        engine_over(local, tmp_path)
    assert not (tmp_path / f"{PREFIX}{KEY}-00000000.safetensors").exists()


def test_the_folder_stays_under_its_bound_and_writes_are_atomic(local, tmp_path, monkeypatch):
    engine = engine_over(local, tmp_path, max_bytes=1)  # every file is over: none is kept
    ask(engine, "import os")
    assert files(tmp_path) == []
    engine = engine_over(local, tmp_path)
    ask(engine, "import os")
    (size,) = {p.stat().st_size for p in files(tmp_path)}
    engine = engine_over(local, tmp_path, max_bytes=2 * size + size // 2)  # two fit
    for text in ("import sys", "import re", "import json"):
        ask(engine, text)
    assert len(files(tmp_path)) == 2
    # a write interrupted part way leaves no cache file, only a partial one
    interrupt_saves(monkeypatch)
    before = files(tmp_path)
    model, _ = local
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[1, 2, 3]]), cache=cache))
    with pytest.raises(KeyboardInterrupt):
        engine.disk.save([1, 2, 3], cache)
    assert files(tmp_path) == before and list(tmp_path.glob(f"{PARTIAL}*"))
    # the partial file of a process that is gone is removed at the next start
    dead = tmp_path / f"{PARTIAL}999999999-{KEY}.safetensors"
    dead.write_bytes(b"x")
    engine_over(local, tmp_path)
    assert not dead.exists()


def test_chat_remembers_the_system_prompt_across_runs(checkpoints, tmp_path):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    command = [sys.executable, "-m", "streamer", "chat", "--model", str(folder)]
    flags = ["--max-tokens", "4", "--system-prompt", SYSTEM, "--prompt-cache-dir", str(tmp_path)]
    runs = [
        subprocess.run(
            [*command, *flags], input="import os\n/stats\n", capture_output=True, text=True
        )
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    assert runs[0].stdout == runs[1].stdout
    cached = [int(re.search(r"(\d+) of the prompt's", r.stderr)[1]) for r in runs]
    assert cached[0] == 0 and cached[1] > 0


@pytest.mark.parametrize(
    "given, said",
    [
        ("file", " is not a folder."),
        # a loop of links, a parent that is a FIFO: OSError tracebacks; a link to nothing, "File
        # exists" from mkdir
        ("loop", ": Too many levels of symbolic links"),
        ("loop/caches", ": Too many levels of symbolic links"),
        ("fifo/caches", ": Not a directory"),
        ("a" * 300, ": File name too long"),
        ("broken", " is a link to /nonexistent, which does not exist: give a folder."),
    ],
)
def test_no_folder_given_as_the_folder_is_refused_before_loading(tmp_path, capsys, given, said):
    from streamer.cli import main

    (tmp_path / "file").write_text("")
    (tmp_path / "loop").symlink_to("loop")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "broken").symlink_to("/nonexistent")
    argv = ["chat", "--model", "/nonexistent", "--prompt-cache-dir", str(tmp_path / given)]
    assert main(argv) == 2
    assert (
        capsys.readouterr().err == f"streamer: error: --prompt-cache-dir {tmp_path / given}{said}\n"
    )


def test_a_quantized_cache_comes_back_quantized(local, tmp_path):
    model, tokenizer = local
    quantized = {"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 0}
    text = SYSTEM + "import os"
    want = streamer.generate(model, tokenizer, text, 6, **quantized)
    assert ask(engine_over(local, tmp_path, options=quantized), text)[0] == want
    answer, done = ask(engine_over(local, tmp_path, options=quantized), text)
    assert answer == want and done.cached_tokens == done.prompt_tokens - 1


def test_serve_remembers_a_conversation_across_restarts(checkpoints, tmp_path):
    """The openai client against two servers in turn over one --prompt-cache-dir."""
    import openai
    from serving import live_server

    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "import os"}]
    flags = ["--prompt-cache-dir", str(tmp_path / "cache")]
    answers = []
    for run in range(2):
        with live_server(folder, flags, tmp_path / f"serve{run}.log") as url:
            client = openai.OpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)
            answers.append(
                client.chat.completions.create(model="m", messages=messages, max_tokens=6)
            )
            deadline = time.monotonic() + 60  # written just after the answer: not cut short
            while not files(tmp_path / "cache") and time.monotonic() < deadline:
                time.sleep(0.05)
    first, second = answers
    assert second.choices[0].message.content == first.choices[0].message.content
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1


def test_folders_under_cache_file_names_are_left_alone(tmp_path):
    """A folder named as a cache file, or as a dead process's partial one, was unlinked at start:
    an IsADirectoryError traceback."""
    for name in (f"{PREFIX}{KEY}-00000000.safetensors", f"{PARTIAL}999999999-{KEY}.safetensors"):
        (tmp_path / name).mkdir()
    DiskCache(tmp_path, "id", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{PARTIAL}999999999-{KEY}.safetensors",
        f"{PREFIX}{KEY}-00000000.safetensors",
    ]


def test_a_header_nested_too_deep_is_a_damaged_file(tmp_path, caplog):
    """JSON nested 200,000 deep in a cache file's header was a RecursionError traceback at start;
    a token list that is not a string, a TypeError."""
    deep = b"[" * 200_000 + b"]" * 200_000
    tokens = b'{"__metadata__": {"0.streamer_model": "id", "0.streamer_tokens": 5}}'
    for key, header in [("d" * 24, deep), ("e" * 24, tokens)]:
        path = tmp_path / f"{PREFIX}{key}-00000000.safetensors"
        path.write_bytes(len(header).to_bytes(8, "little") + header)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        assert DiskCache(tmp_path, "id", 1 << 30).entries == {}
    assert len([r for r in caplog.records if "damaged prompt cache" in r.getMessage()]) == 2
    assert files(tmp_path) == []


def test_partial_files_named_past_any_pid_are_left_alone(tmp_path):
    """A partial file whose pid is past any (os.kill's OverflowError) or a digit to str.isdigit
    only ("²", int's ValueError) was a traceback at start."""
    names = [f"{PARTIAL}{'9' * 30}-{KEY}.safetensors", f"{PARTIAL}²-{KEY}.safetensors"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    DiskCache(tmp_path, "id", 1 << 30)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
