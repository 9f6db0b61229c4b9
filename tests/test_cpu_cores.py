"""The CPU backend's matmuls cut across cores (streamer/cpu_cores.py): every cut computes what the
uncut call computes, bit for bit, on every read path and on a generation thread."""

from __future__ import annotations

import contextlib
import json
import os
import threading

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.switch_layers import SwitchGLU

import streamer
from streamer import cpu_cores
from streamer.cli import main
from streamer.errors import ArgumentError
from streamer.loading.backend import default_threads
from streamer.loading.options import load_options

# The cut is the CPU backend's: on a GPU `threads` is 1 and more is refused
# (test_a_gpu_takes_no_threads checks that with the backend stood in, here on the CPU).
pytestmark = pytest.mark.skipif(
    mx.default_device() != mx.cpu, reason="the CPU backend's cut: a GPU computes every matmul"
)

ENTRY_PAYS = cpu_cores.MIN_PART_BYTES  # a routed entry's experts worth a part of their own


def switch_glu(quantized: bool) -> SwitchGLU:
    mx.random.seed(3)
    glu = SwitchGLU(64, 96, 8)
    if quantized:
        nn.quantize(glu, group_size=32, bits=4)
    mx.eval(glu.parameters())
    return glu


@pytest.mark.parametrize("quantized", [True, False])
@pytest.mark.parametrize("tokens", [1, 40])  # a decode step; a prompt (sorted by expert)
@pytest.mark.parametrize("cores", [2, 3, 16])
def test_routed_entries_on_cores_are_the_whole_call(quantized, tokens, cores):
    glu = switch_glu(quantized)
    x = mx.random.normal((1, tokens, 64))
    indices = mx.random.randint(0, 8, (1, tokens, 6)).astype(mx.uint32)
    whole = glu(x, indices)
    cut = cpu_cores.routed_on_cores(glu, x, indices, cores, ENTRY_PAYS)
    assert cut.shape == whole.shape
    assert mx.array_equal(cut, whole)


@pytest.mark.parametrize("cores", [2, 4])
def test_entries_of_one_expert_each_are_cut_by_token(monkeypatch, cores):
    """The slot path computes a call's hits and misses as entries of one expert each: [1, n, 1]."""
    glu = switch_glu(True)
    x = mx.random.normal((1, 6, 64))
    indices = mx.random.randint(0, 8, (1, 6, 1)).astype(mx.uint32)
    whole = glu(x, indices)
    cut = []
    real = cpu_cores.on_parts
    monkeypatch.setattr(
        cpu_cores, "on_parts", lambda *a, **k: cut.append((*a[1:], k["axis"])) or real(*a, **k)
    )
    assert mx.array_equal(cpu_cores.routed_on_cores(glu, x, indices, cores, ENTRY_PAYS), whole)
    assert cut == [(6, cores, -3)]  # six tokens, on every core


def test_one_routed_entry_is_not_cut(monkeypatch):
    calls = []
    glu = switch_glu(True)
    monkeypatch.setattr(cpu_cores, "on_parts", lambda *a, **k: calls.append(a))
    x, one = mx.zeros((1, 1, 64)), mx.zeros((1, 1, 1), mx.uint32)
    out = cpu_cores.routed_on_cores(glu, x, one, 4, ENTRY_PAYS)
    assert out.shape == (1, 1, 1, 64) and calls == []


@pytest.mark.parametrize(("entry_bytes", "parts"), [(ENTRY_PAYS // 8, None), (ENTRY_PAYS // 2, 3)])
def test_routed_entries_too_small_to_pay_are_cut_less(monkeypatch, entry_bytes, parts):
    """Each part at least MIN_PART_BYTES of experts to compute, as a linear layer's: a model of
    tiny experts (the demo's) decoded slower cut (2 cores: 540 tok/s against 650)."""
    glu = switch_glu(True)
    x = mx.random.normal((1, 1, 64))
    indices = mx.random.randint(0, 8, (1, 1, 6)).astype(mx.uint32)
    cut = []
    real = cpu_cores.on_parts
    monkeypatch.setattr(cpu_cores, "on_parts", lambda *a, **k: cut.append(a[2]) or real(*a, **k))
    out = cpu_cores.routed_on_cores(glu, x, indices, 4, entry_bytes)
    assert mx.array_equal(out, glu(x, indices))
    assert cut == ([] if parts is None else [parts])


class Head(nn.Module):
    def __init__(self, mode: str, bias: bool):
        super().__init__()
        self.proj = nn.Linear(128, 200, bias=bias)
        self.embed = nn.Embedding(200, 128)
        nn.quantize(self, group_size=32, bits=4, mode=mode)
        mx.eval(self.parameters())


@pytest.mark.parametrize(("mode", "bias"), [("affine", True), ("affine", False), ("mxfp4", True)])
def test_cut_linear_layers_compute_as_before_under_their_names(monkeypatch, mode, bias):
    monkeypatch.setattr(cpu_cores, "MIN_PART_BYTES", 1)
    head = Head(mode, bias)
    x = mx.random.normal((3, 5, 128))
    before = (head.proj(x), head.embed.as_linear(x), head.embed(mx.array([[1, 7]])))
    names = [name for name, _ in tree_flatten(head.parameters())]
    assert cpu_cores.split_linears(head, 3) == 2
    assert isinstance(head.proj, cpu_cores.CoreSplitLinear) and head.proj.parts == 3
    after = (head.proj(x), head.embed.as_linear(x), head.embed(mx.array([[1, 7]])))
    assert all(mx.array_equal(a, b) for a, b in zip(before, after))
    assert [name for name, _ in tree_flatten(head.parameters())] == names


def test_layers_too_small_to_pay_are_left_whole():
    head = Head("affine", False)  # 200 x 128 at 4 bits: 12.5 KiB, far below a part's minimum
    assert cpu_cores.split_linears(head, 8) == 0
    assert type(head.proj) is nn.QuantizedLinear


def test_parts_are_contiguous_and_cover_the_rows():
    assert cpu_cores.bounds(8, 3) == [(0, 2), (2, 5), (5, 8)]
    assert cpu_cores.bounds(5, 5) == [(i, i + 1) for i in range(5)]


def test_threads_are_decided_once_for_the_backend(four_cores_at_least):
    assert load_options().threads == four_cores_at_least  # every usable core
    assert load_options(threads=1).threads == 1
    # numpy's integer, as load's memory_budget and generate's counts take it
    assert type(load_options(threads=np.int64(1)).threads) is int
    for wrong in (0, -2, "2", 1.5, True, np.bool_(True), np.int64(0)):
        with pytest.raises(ArgumentError, match="threads must be a whole number of cores"):
            load_options(threads=wrong)
    with pytest.raises(ArgumentError, match="--threads must be"):
        load_options(threads=0, option="--")


def test_more_threads_than_cores_are_the_cores(monkeypatch):
    """-t 1000 made up to a stream (an OS thread) per MiB of the output head, on 2 cores."""
    monkeypatch.setattr(cpu_cores, "usable_cores", lambda: 2)
    monkeypatch.setattr("streamer.loading.backend.usable_cores", lambda: 2)
    options = load_options(threads=1000)
    assert (options.threads, options.threads_why) == (2, "asked for 1000; this process may use 2")
    assert load_options(threads=2).threads_why == "asked for"


@pytest.mark.parametrize(
    ("rank", "hosts", "threads", "ranks"),
    [  # `streamer launch -n 2` (or --hosts 127.0.0.1,127.0.0.1) on 2 cores: 1 each, not 2
        (1, [["127.0.0.1:5000"], ["127.0.0.1:5001"]], 1, 2),
        (0, [["127.0.0.1:5000"]] * 3, 1, 3),  # more ranks than cores: 1 each
        # a hostfile naming host 10.0.0.1 twice: its ranks share it, 10.0.0.2's rank has its own
        (2, [["10.0.0.1:5000"], ["10.0.0.2:5001"], ["10.0.0.1:5002"]], 1, 2),
        (1, [["10.0.0.1:5000"], ["10.0.0.2:5001"], ["10.0.0.1:5002"]], 2, 1),
        (0, [["10.0.0.1:5000", "10.0.0.3:5001"], ["10.0.0.3:5002"]], 1, 2),
        (0, "\n", 2, 1),  # a ring of one: mlx.launch writes "" (`-n 1`)
        (5, [["127.0.0.1:5000"]] * 2, 2, 1),  # not the ring's file: MLX says what is wrong
        (0, '{"hosts": 2}', 2, 1),
        (0, [[1, None], "127.0.0.1:5001"], 2, 1),
    ],
)
def test_ranks_on_one_host_share_its_cores(monkeypatch, tmp_path, rank, hosts, threads, ranks):
    """Every rank took every core: 2 ranks on a 2-core machine ran 4 matmul threads. A rank
    learns its host's ranks as mlx.launch's ring tells it: MLX_RANK, and MLX_HOSTFILE naming a
    file of each rank's "ip:port" addresses."""
    monkeypatch.setattr("streamer.loading.backend.usable_cores", lambda: 2)
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(hosts if isinstance(hosts, str) else json.dumps(hosts))
    monkeypatch.setenv("MLX_RANK", str(rank))
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    options = load_options()
    assert options.threads == threads
    shared = f"the 2 cores this process may use, shared by {ranks} ranks on this host"
    assert options.threads_why == (shared if ranks > 1 else "every core this process may use")
    assert load_options(threads=2).threads == 2  # asked for: taken as it is


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="a FIFO to name")
def test_a_hostfile_that_is_no_regular_file_is_no_launch(monkeypatch, tmp_path):
    """MLX_HOSTFILE naming a FIFO was read until something wrote it (a load that waited on it
    forever; a device such as /dev/zero, until memory ran out): refused unread, as no launch."""
    fifo = tmp_path / "ring"
    os.mkfifo(fifo)
    two_ranks = json.dumps([["127.0.0.1:5000"], ["127.0.0.1:5001"]])

    def write() -> None:  # what a reader of the FIFO gets, if it waits
        with contextlib.suppress(BrokenPipeError):
            fifo.write_text(two_ranks)

    writer = threading.Thread(target=write)
    writer.start()
    monkeypatch.setenv("MLX_RANK", "0")
    monkeypatch.setenv("MLX_HOSTFILE", str(fifo))
    try:
        assert cpu_cores.ranks_on_this_host() == 1
    finally:  # the writer waits for a reader: this one lets it end
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer.join()
        os.close(reader)
    for rank in ("-1", "²", "9" * 5000, ""):  # int() refuses the last three
        monkeypatch.setenv("MLX_RANK", rank)
        monkeypatch.setenv("MLX_HOSTFILE", str(tmp_path / "hosts.json"))
        (tmp_path / "hosts.json").write_text(two_ranks)
        assert cpu_cores.ranks_on_this_host() == 1


def test_a_share_of_the_cores_is_even_and_one_at_least():
    assert default_threads(8, 1) == (8, "every core this process may use")
    assert default_threads(5, 2)[0] == 2
    assert default_threads(1, 2) == (
        1,
        "the 1 core this process may use, shared by 2 ranks on this host",
    )


def test_a_gpu_takes_no_threads(monkeypatch):
    monkeypatch.setattr("streamer.loading.backend.backend", lambda: "metal")
    assert load_options().threads == 1
    with pytest.raises(ArgumentError, match="on metal the GPU computes every matmul"):
        load_options(threads=4)


@pytest.fixture(autouse=True)
def four_cores_at_least(monkeypatch):
    """A machine of 4 cores or more: the loads below ask for 3, which a 2-core machine's (CI's)
    would take as its 2 (threads past the cores are the cores)."""
    cores = max(cpu_cores.usable_cores(), 4)
    monkeypatch.setattr("streamer.loading.backend.usable_cores", lambda: cores)
    return cores


def logits(folder, read_path: str, threads: int, tokens: list[int]) -> mx.array:
    model, _ = streamer.load(folder, memory_budget=0, read_path=read_path, threads=threads)
    cut = [m for _, m in model.named_modules() if isinstance(m, cpu_cores.CoreSplitLinear)]
    assert bool(cut) == (threads > 1)  # the attention projections and the output head
    assert all(layer.cores == threads for layer in model.streamer.layers)
    try:
        out = model(mx.array([tokens]))
        mx.eval(out)
        return out
    finally:
        model.streamer.close()


@pytest.mark.parametrize("read_path", ["mapped", "slots"])
def test_a_model_on_cores_answers_as_on_one(checkpoints, monkeypatch, read_path):
    monkeypatch.setattr(cpu_cores, "MIN_PART_BYTES", 1)  # the tiny model's layers cut too
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    tokens = [1, 5, 9, 2, 7]
    one = logits(folder, read_path, 1, tokens)
    on_cores = logits(folder, read_path, 3, tokens)
    assert mx.array_equal(one, on_cores)
    # serve and chat generate on a thread of their own: the streams are that thread's
    found = []
    thread = threading.Thread(target=lambda: found.append(logits(folder, read_path, 3, tokens)))
    thread.start()
    thread.join()
    assert mx.array_equal(one, found[0])


def test_the_residency_line_says_the_cores_decided(
    checkpoints, capsys, monkeypatch, four_cores_at_least
):
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    argv = ["generate", "--model", str(folder), "-p", "hi", "-m", "1", "--ignore-chat-template"]
    assert main([*argv, "-t", "1"]) == 0
    assert "; matmuls on 1 core (asked for)\n" in capsys.readouterr().err
    model, _ = streamer.load(folder, threads=3)
    assert model.streamer.residency.endswith("; matmuls on 3 cores (asked for)")
    model.streamer.close()
    model, _ = streamer.load(folder)
    cores = four_cores_at_least
    every = f"{cores} core{'s' if cores > 1 else ''} (every core this process may use)"
    assert model.streamer.residency.endswith(f"; matmuls on {every}")
    model.streamer.close()
    monkeypatch.setattr("streamer.loading.backend.backend", lambda: "metal")
    assert load_options().threads_why == ""  # a GPU computes them: nothing to say


PROMPT = list(range(1, 40))  # 39 tokens: mlx-lm's sorted gather (64 entries or more), as a prefill


def answer(folder, threads: int, **load) -> tuple[mx.array, str]:
    model, _ = streamer.load(folder, threads=threads, **load)
    try:
        out = model(mx.array([PROMPT]))
        mx.eval(out)
        return out, type(model.streamer.layers[0].compute_mode).__name__
    finally:
        model.streamer.close()


@pytest.mark.parametrize(
    ("load", "mode"),
    [
        ({"memory_budget": 0}, "GatherConvert"),  # bf16 scales computed in float32
        ({"memory_budget": 0, "dtype": "bfloat16"}, "InPageCache"),  # the files read before
        ({"memory_budget": 0, "dtype": "bfloat16", "verify_reads": True}, "Prefetched"),
        ({"memory_budget": 40_000}, "HotReads"),
        ({}, "Resident"),
        ({"memory_budget": 20_000, "read_path": "slots"}, "Slots"),  # 1 slot: rounds
        ({"memory_budget": 0, "read_path": "slots"}, "Slots"),
    ],
)
def test_every_compute_mode_on_cores_answers_as_on_one(checkpoints, monkeypatch, load, mode):
    monkeypatch.setattr(cpu_cores, "MIN_PART_BYTES", 1)
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    one, ran = answer(folder, 1, **load)
    assert ran == mode
    assert mx.array_equal(one, answer(folder, 3, **load)[0])


# containers of their own kind: SwitchMLP (nemotron_h, phixtral), one entry a token (llama4), a
# biased clamped SwiGLU (gpt_oss), resident children (muse_spark), stacked from a list (dbrx)
@pytest.mark.parametrize(
    "arch", ["nemotron_h", "phixtral", "llama4", "gpt_oss", "muse_spark", "dbrx"]
)
def test_each_kind_of_container_on_cores_answers_as_on_one(checkpoints, monkeypatch, arch):
    monkeypatch.setattr(cpu_cores, "MIN_PART_BYTES", 1)
    folder = checkpoints.repacked(checkpoints.mlx(arch))
    for load in ({"memory_budget": 0}, {"memory_budget": 0, "read_path": "slots"}):
        assert mx.array_equal(answer(folder, 1, **load)[0], answer(folder, 3, **load)[0])


def test_drafted_kv_quantized_answers_on_a_thread_are_one_core_s(checkpoints, monkeypatch):
    """Speculative verify passes (several tokens a call) and a quantized KV cache, on a
    generation thread of its own, as serve and chat run them."""
    monkeypatch.setattr(cpu_cores, "MIN_PART_BYTES", 1)
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    options = {"max_tokens": 24, "prompt_lookup": 2, "kv_bits": 4, "kv_group_size": 32}

    def tokens(threads: int, found: list) -> None:
        model, tokenizer = streamer.load(folder, threads=threads, memory_budget=0)
        responses = streamer.stream_generate(model, tokenizer, "the the the the", **options)
        found.append([(r.token, r.logprobs.tolist()) for r in responses])
        model.streamer.close()

    one, on_cores = [], []
    tokens(1, one)
    thread = threading.Thread(target=tokens, args=(3, on_cores))
    thread.start()
    thread.join()
    assert len(one[0]) == 24 and on_cores == one


def native_threads() -> int:
    """This process's threads that Python did not start: MLX's streams' among them."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux lists a process's threads")
def test_answers_on_one_thread_start_no_threads_after_the_first(checkpoints, monkeypatch):
    """MLX gives each thread that computes streams of its own, each a thread that lives as long
    as the process; the cut's are made once per thread, not once per answer. Counted: the
    threads that are not Python's (the slot pool's readers are, and start as reads come, up to
    READERS: one more started by a later answer had failed this test, 3 runs in 5)."""
    monkeypatch.setattr(cpu_cores, "MIN_PART_BYTES", 1)
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    model, tokenizer = streamer.load(folder, threads=3, memory_budget=0, read_path="slots")
    streamer.generate(model, tokenizer, "hello there", max_tokens=4)
    threads = native_threads()
    for _ in range(5):
        streamer.generate(model, tokenizer, "hello there", max_tokens=4)
    assert native_threads() == threads
    model.streamer.close()


@pytest.mark.parametrize(
    "load", [{"memory_budget": 0}, {"memory_budget": 20_000, "read_path": "slots"}]
)
def test_a_ctrl_c_inside_a_cut_call_leaves_the_next_answer_one_core_s(
    checkpoints, monkeypatch, load
):
    """The call's second part interrupted (its first built on a stream of its own, a stack of
    copies installed): the next answer is a fresh model's."""
    monkeypatch.setattr(cpu_cores, "MIN_PART_BYTES", 1)
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    model, tokenizer = streamer.load(folder, threads=3, **load)

    def answer(model) -> list[int]:
        return [r.token for r in streamer.stream_generate(model, tokenizer, "hello there", 6)]

    container = type(model.streamer.layers[0].container)
    whole, calls = container.__call__, []

    def interrupted(self, x, indices):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return whole(self, x, indices)

    with monkeypatch.context() as patch:
        patch.setattr(container, "__call__", interrupted)
        with pytest.raises(KeyboardInterrupt):
            answer(model)
    fresh, _ = streamer.load(folder, threads=1, **load)
    assert answer(model) == answer(fresh)
    model.streamer.close()
    fresh.streamer.close()
