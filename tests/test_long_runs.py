"""Long-running use: a chat of many turns past the model's context, a server answering request
after request. What a run holds (kept KV caches, descriptors, threads, mappings) stays bounded."""

from __future__ import annotations

import gc
import io
import json
import os
import threading
from pathlib import Path

import mlx.core as mx
import pytest
from serving import SERVE_FLAGS, connection, live_server

import streamer
from streamer.cache.slot_pool import READERS, _readers
from streamer.cli import parser
from streamer.cli.chat import chat
from streamer.server.api import Completion, Sampling
from streamer.server.disk_cache import DiskCache
from streamer.server.disk_entries import model_identity
from streamer.server.engine import Done, Engine, Job, Step

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def local(checkpoints):
    return streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def chatted(engine: Engine, lines: list[str], context: int) -> str:
    """What the chat printed on stderr after `lines`, once the last answer's cache is kept."""
    err = io.StringIO()
    stdin = io.StringIO("".join(line + "\n" for line in lines))
    chat(engine, max_tokens=8, context=context, stdin=stdin, stdout=io.StringIO(), stderr=err)
    engine.wait_kept()
    return err.getvalue()


def test_a_chat_past_its_context_says_so_and_reset_frees_its_kv_cache(local):
    model, tokenizer = local
    engine = Engine(model, tokenizer, 2)
    said = chatted(engine, [f"tell me about {i}" for i in range(30)] + ["/reset", "hi"], 120)
    assert said.count("but the model's context is 120 tokens: /reset to start over") > 10
    # after /reset only the new conversation's KV cache is held, as in a chat that began with it
    fresh = Engine(model, tokenizer, 2)
    chatted(fresh, ["hi"], 120)
    assert len(engine.prompt_cache) == len(fresh.prompt_cache) == 1
    assert engine.prompt_cache.nbytes == fresh.prompt_cache.nbytes


def test_a_first_message_past_the_context_is_told_to_be_shorter(local):
    """It was told to /reset, which starts the same empty conversation again."""
    model, tokenizer = local
    said = chatted(Engine(model, tokenizer, 2), ["word " * 200, "hi"], 120)
    assert "but the model's context is 120 tokens: send a shorter message" in said
    assert "/reset to start over" not in said


def ask(engine: Engine, text: str) -> Done:
    prompt = engine.tokenizer.encode(text)
    job = engine.submit(Job(Completion(False, "m", 4, Sampling(), text=text), prompt, 4))
    while not isinstance(event := job.events.get(timeout=120), Done):
        assert isinstance(event, Step), event
    engine.wait_kept()
    return event


def test_the_kept_kv_caches_stay_under_their_byte_bound(local):
    model, tokenizer = local
    engine = Engine(model, tokenizer, 10)
    ask(engine, "question 0")
    one = engine.prompt_cache.nbytes  # one short conversation's cache
    engine = Engine(model, tokenizer, 10, prompt_cache_bytes=3 * one)
    for i in range(12):
        ask(engine, f"question {i}")
        assert engine.prompt_cache.nbytes <= 3 * one
    assert len(engine.prompt_cache) == 3
    # serve bounds them by default, as llama.cpp's server does (its --cache-ram: 8 GiB)
    serve = ["serve", "--model", "m"]
    assert parser().parse_args(serve).prompt_cache_bytes == 8 << 30
    assert parser().parse_args([*serve, "--prompt-cache-bytes", "1G"]).prompt_cache_bytes == 1 << 30


def held(pid: str = "self") -> dict:
    """What a process holds that a leak grows: descriptors, threads, memory mappings."""
    return {
        "descriptors": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": len(os.listdir(f"/proc/{pid}/task")),
        "mappings": len(Path(f"/proc/{pid}/maps").read_text().splitlines()),
    }


def objects() -> int:
    gc.collect()
    return len(gc.get_objects())


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self (Linux)")
@pytest.mark.parametrize("read_path", ["mapped", "slots"])
def test_request_after_request_holds_nothing_more(checkpoints, tmp_path, read_path):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    model, tokenizer = streamer.load(folder, read_path=read_path, memory_budget=0)
    disk = DiskCache(tmp_path, model_identity(model, {}), 1 << 30)
    engine = Engine(model, tokenizer, 4, disk=disk)

    def serve(first: int, n: int) -> None:  # as a server's requests, and a program's calls
        for i in range(first, first + n):
            ask(engine, f"question {i}")
            streamer.generate(model, tokenizer, f"call {i}", 4)

    serve(0, 10)  # warm: lazy imports, MLX's buffer pool, the prompt cache's 4 entries
    all_readers()
    # objects() collects garbage first: an earlier test's, freed between the two samples, had
    # closed a descriptor mid-run (45 before, 44 after, in one CI run of the whole suite)
    count = objects()
    before, memory = held(), mx.get_active_memory()
    serve(10, 40)
    assert objects() <= count + 40 * 4  # the disk's entries (a path, a tuple, an Entry) alone
    assert held() == before and len(engine.prompt_cache) == 4
    assert mx.get_active_memory() <= memory + (1 << 20)  # one kept KV cache is 256 KiB here


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc (Linux)")
def test_a_server_up_for_many_requests_holds_nothing_more(served_folder, tmp_path):
    caches = tmp_path / "caches"
    flags = [*SERVE_FLAGS, "--prompt-cache-dir", str(caches)]
    with live_server(served_folder, flags, tmp_path / "serve.log") as url:
        (pid,) = [p for p in os.listdir("/proc") if p.isdigit() and str(caches) in _cmdline(p)]

        def answer(first: int, n: int) -> None:  # whole and streamed, a connection each
            for i in range(first, first + n):
                body = {"messages": [{"role": "user", "content": f"q {i}"}], "max_tokens": 3}
                body["stream"] = i % 2 == 1
                http = connection(url)
                http.request("POST", "/v1/chat/completions", json.dumps(body), JSON)
                response = http.getresponse()
                assert response.status == 200 and response.read()
                http.close()

        answer(0, 10)
        before = held(pid)
        answer(10, 50)
        now = held(pid)
        # one descriptor, thread or mapping a request would be 50 more: the last connection
        # may still be closing (its socket, its thread), and the slot pool's readers start as
        # reads need them (READERS at most, a stack mapping or a few each)
        assert now["descriptors"] <= before["descriptors"] + 2, (before, now, _descriptors(pid))
        assert now["threads"] <= before["threads"] + 1 + READERS
        assert now["mappings"] <= before["mappings"] + 3 * (1 + READERS)


def all_readers() -> None:
    """The slot pool's reader threads all started (they start as reads need them, READERS at
    most): the threads counted after are those requests leave."""
    started = threading.Barrier(READERS)
    list(_readers.map(lambda _: started.wait(timeout=30), range(READERS)))


def _descriptors(pid: str) -> list[str]:
    """What a process's descriptors are open on: a failure's message."""
    fds = Path(f"/proc/{pid}/fd")
    return sorted(os.readlink(fd) for fd in fds.iterdir() if fd.is_symlink())


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:  # ended since listed
        return ""
