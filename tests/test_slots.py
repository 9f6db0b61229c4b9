"""The slot read path in a model: kernels on the pool itself, the reuse rule, the choice of path.

test_parity.py and test_families.py run every parity check on both read paths; these tests cover
what only the slot path has."""

from __future__ import annotations

import gc
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from conftest import reference_model
from test_parity import PROMPT, assert_exactly_as, greedy_tokens
from test_slot_pool import HostFill, HostLanding, host_sources

import streamer
from streamer.cache import settle, slot_pool
from streamer.cache.budget import layer_groups
from streamer.errors import StreamerError
from streamer.experts import slots as slot_calls
from streamer.experts.layer import StreamingExperts
from streamer.io import cuda_gather
from streamer.io.cuda_gather import NO_SLOT, UNWANTED
from streamer.io.manifest import read_manifest
from streamer.loading import assembly, pools, residency
from streamer.loading import backend as backends
from streamer.loading import load as loading
from streamer.loading.backend import Memory


def slot_bytes(folder) -> int:
    layer = read_manifest(folder).layers[0]
    return sum(t.nbytes for t in layer.tensors)


@pytest.fixture(scope="module")
def float32_model(checkpoints):
    """An MLX 4-bit checkpoint with float32 scales: the CPU computes in its stored dtype, so the
    kernels run on the pool's arrays with slot indices, as on a GPU (no per-call copy)."""
    src = checkpoints.mlx("qwen3_moe", dtype="float32")
    return src, checkpoints.repacked(src)


def test_a_tiny_pool_under_heavy_eviction_matches_the_resident_model(float32_model, monkeypatch):
    """A pool of 4 slots for 2 layers x top-4 of 16 experts: nearly every routed expert rewrites
    a slot that the previous layer's kernels just read, and the prompt runs in rounds. A slot
    reused before those kernels finished would change the tokens. Every call takes the synced
    path (on CUDA decode would otherwise gather, reading misses without placing them)."""
    monkeypatch.setattr(slot_calls, "GATHERED_ROUTES", 0)
    src, folder = float32_model
    one = slot_bytes(folder)
    model, tokenizer = streamer.load(folder, memory_budget=4 * one, read_path="slots")
    reference = reference_model(src)
    prompt = mx.array(tokenizer.encode(PROMPT))
    assert_exactly_as(model, reference, prompt, 160)
    decode = model.streamer.stats.decode
    (pool,) = model.streamer.pools
    assert pool.slots == 4 and decode.bytes_copied == 0  # computed on the pool itself
    assert decode.experts_read > 0.5 * decode.layer_calls * 4  # mostly misses
    for layer in model.streamer.layers:  # the container's stacked tensors are the pool's arrays
        tensors = [layer.container[p][k] for p, k in layer._slots]
        assert all(t is a for t, a in zip(tensors, pool.arrays))


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("slots", [0, 12])
def test_a_pool_in_chunks_matches_the_resident_model(float32_model, monkeypatch, slots, stacked):
    """Arrays of at most 3 slots. Budget 0: one pool of 16 slots in 6 chunks, so every call's
    experts lie in several chunks: computed once per chunk, the outputs put back in routed order
    (the CPU's way), or (`stacked`, a GPU's) taken from their chunks into one stack and computed
    as one call. 12 slots: 6 per layer, more than a chunk, so each layer has a pool of its own,
    in 2 chunks; a prompt's calls go in rounds, in parts or (`stacked`) on a stack a round."""
    src, folder = float32_model
    largest = max(t.nbytes for t in read_manifest(folder).layers[0].tensors)
    monkeypatch.setattr(residency, "CHUNK_BYTES", 3 * largest)
    gpu_way(monkeypatch, stacked)
    calls = []
    monkeypatch.setattr(slot_calls.Slots, "_entries", record(slot_calls.Slots._entries, calls))
    model, tokenizer = streamer.load(
        folder, memory_budget=slots * slot_bytes(folder), read_path="slots"
    )
    pools = model.streamer.pools
    assert [(p.slots, len(p.chunks)) for p in pools] == ([(16, 6)] if slots == 0 else [(6, 2)] * 2)
    assert all(a.nbytes <= 3 * largest for p in pools for chunk in p.chunks for a in chunk)
    prompt = mx.array(tokenizer.encode(PROMPT))
    assert_exactly_as(model, reference_model(src), prompt, 40)
    assert f"{sum(len(p.chunks) for p in pools)} chunks" in model.streamer.residency
    assert (model.streamer.stats.decode.bytes_copied > 0) == stacked  # the stacks are copies
    # parts (_entries) are the CPU's way only; a GPU's computes every entry at once: one stack a
    # call (budget 0) or, 6 slots (a prompt call's 16 experts in rounds), one stack a round
    assert bool(calls) != stacked


def mapped_runs_here(read_path: str) -> None:
    """The mapped path is refused on MLX's CUDA backend (tests/test_load_options.py checks the
    refusal), so its tests have nothing to run there."""
    if read_path == "mapped" and backends.backend() == "cuda":
        pytest.skip("read_path='mapped' is refused on CUDA")


def gpu_way(monkeypatch, stacked: bool) -> None:
    """Calls across chunks or in rounds computed a GPU's way (`stacked`: stacks, every entry a
    round) or the CPU's (parts), on either backend; the CPU's is skipped on a GPU, where parts
    differ from the whole call's kernels in the last digit."""
    if not stacked and mx.default_device() != mx.cpu:
        pytest.skip("on a GPU parts differ from the whole call in the last digit")
    monkeypatch.setattr(slot_calls, "stack_bytes", lambda: slot_calls.STACK_BYTES * stacked)


def record(method, calls: list):
    """`method`, noting each call in `calls`."""

    def recorded(*args, **kwargs):
        calls.append(args)
        return method(*args, **kwargs)

    return recorded


def test_converted_copies_are_not_kept_after_the_call(checkpoints):
    """bf16 scales computed in float32 (asked for: a GPU's default is bf16, where nothing is
    converted): each call takes and converts its routed slots. The containers must not keep those
    copies once the output is built: every layer's would stay in memory (Kimi K2 at full depth:
    176 MB a layer, 10 GB in all)."""
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path="slots", dtype=mx.float32)
    mx.eval(model(mx.array(tokenizer.encode(PROMPT))[None]))
    (pool,) = model.streamer.pools
    assert model.streamer.stats.prefill.bytes_copied > 0  # it did convert
    for layer in model.streamer.layers:
        tensors = [layer.container[p][k] for p, k in layer._slots]
        assert all(t is a for t, a in zip(tensors, pool.arrays))


def test_a_pool_larger_than_the_available_memory_is_refused_before_it_is_made(
    float32_model, monkeypatch
):
    _, folder = float32_model
    # what a load's plan is made from
    monkeypatch.setattr(loading, "available_memory", lambda: Memory(1))
    made = []
    monkeypatch.setattr(pools, "SlotPool", lambda *a, **k: made.append(a))
    with pytest.raises(StreamerError, match=r"does not fit in the 1 B of memory available"):
        streamer.load(folder, memory_budget=4 * slot_bytes(folder), read_path="slots")
    assert made == []


@pytest.mark.parametrize("read_path", ["slots", "mapped"])
def test_a_budget_past_every_expert_that_the_memory_cannot_hold_is_refused(
    float32_model, monkeypatch, read_path
):
    """A budget larger than the machine's memory makes every expert resident (copied into memory
    on either path): refused before any is read, as a smaller budget's slot pool is; it was read
    until the process was killed (Kimi K2 at 4 layers: 28.5 GB of experts, `--memory-budget 100G`
    on a 24 GiB machine)."""
    mapped_runs_here(read_path)
    _, folder = float32_model
    monkeypatch.setattr(loading, "available_memory", lambda: Memory(1))
    monkeypatch.setattr(StreamingExperts, "make_resident", lambda self: pytest.fail("read"))
    monkeypatch.setattr(pools, "open_pools", lambda *a, **k: pytest.fail("pool made"))
    with pytest.raises(StreamerError, match=r"every expert in memory, .* does not fit in the 1 B"):
        streamer.load(folder, memory_budget=1 << 50, read_path=read_path)


def test_budget_0s_pool_past_the_memory_says_what_does_fit(float32_model, monkeypatch):
    """Budget 0's pool (the smallest) past the memory available said "give a smaller memory
    budget": there is none; the mapped path's budget 0 keeps no experts in memory."""
    _, folder = float32_model
    monkeypatch.setattr(loading, "available_memory", lambda: Memory(1))
    with pytest.raises(StreamerError) as refused:
        streamer.load(folder, memory_budget=0, read_path="slots")
    told = "it is budget 0's, the smallest; free memory, or read with {} (budget 0 there keeps "
    told += "none)."
    assert str(refused.value).endswith(told.format("read_path='mapped'"))
    assert refused.value.flags.endswith(told.format("--read-path mapped"))


def test_a_hot_cache_larger_than_the_available_memory_is_refused(float32_model, monkeypatch):
    """The mapped path's hot-expert cache, the slot pool's counterpart, was never held against the
    memory available: a budget past it was taken, the cache free to grow past the memory."""
    mapped_runs_here("mapped")
    _, folder = float32_model
    monkeypatch.setattr(loading, "available_memory", lambda: Memory(1))
    monkeypatch.setattr(assembly, "HotExperts", lambda *a: pytest.fail("cache made"))
    with pytest.raises(
        StreamerError,
        match=r"^a hot-expert cache, .* \(memory budget .*\), does not fit in the 1 B of memory "
        "available: give a smaller memory budget",
    ):
        streamer.load(folder, memory_budget=4 * slot_bytes(folder), read_path="mapped")


def test_layers_are_grouped_so_a_group_fits_one_chunk():
    """48 layers, 3000 slots, 1365 to a chunk (a Qwen3-30B-A3B at 8 GB, arrays of 1 GiB): three
    pools of one chunk each; a layer whose own share passes a chunk has a pool of its own."""
    assert layer_groups(48, 3000, 1365) == [(0, 21, 1312), (21, 42, 1313), (42, 48, 375)]
    assert layer_groups(48, 1000, 1365) == [(0, 48, 1000)]
    assert layer_groups(2, 12, 3) == [(0, 1, 6), (1, 2, 6)]


class GatherStandIn:
    """io/cuda_gather.py's kernel on this CPU: each routed expert's tensors from its slot when the
    table has one, else read from the layer's files (never from the pool: a table that named a
    slot its expert has left would compute on another expert and change the tokens). An UNWANTED
    row is all ones bits (NaN in float32): if a kernel read it, the logits would show it."""

    def __init__(self, tensors, source):
        self._tensors, self._source = tensors, source
        self.calls = self.hits = self.misses = 0  # distinct experts from a slot, from the files
        self.unwanted: list[int] = []  # per call, the rows left unwritten

    def __call__(self, indices, table, sources, arrays):
        assert len(arrays) == len(self._tensors)
        self.calls += 1
        routed, slot_of = np.array(indices).ravel(), np.array(table)
        wanted = routed != UNWANTED
        held = slot_of[np.unique(routed[wanted])] != NO_SLOT
        self.hits, self.misses = self.hits + held.sum(), self.misses + (~held).sum()
        self.unwanted.append(int(np.count_nonzero(~wanted)))
        stacks = []
        for t, (tensor, at) in enumerate(zip(self._tensors, self._source.placements)):
            rows = []
            for expert in routed:
                if expert == UNWANTED:
                    rows.append(np.full(tensor.nbytes, 0xFF, np.uint8))
                elif slot_of[expert] != NO_SLOT:
                    rows.append(np.array(arrays[t][int(slot_of[expert])].view(mx.uint8)).ravel())
                else:
                    row = np.empty(tensor.nbytes, np.uint8)
                    self._source.files[at.file].preadv(at.offset + int(expert) * at.stride, [row])
                    rows.append(row)
            stack = mx.array(np.stack(rows)).view(tensor.dtype)
            stacks.append(stack.reshape(len(routed), *tensor.shape))
        return stacks


def gathered_model(monkeypatch, folder, slots: int, moved_by: str) -> tuple:
    """The model at `folder` on a pool of `slots` slots whose decode calls are gathered by a
    stand-in kernel (its stand-ins, by layer source), moved experts reaching their slots by reads
    after the fence or (`fill`, CUDA's default) by the fill kernel's stand-in (HostFill), which
    copies from the files' host mappings: (model, tokenizer, stand-ins, fill)."""
    stand_ins, fill = {}, []

    def stand_in(tensors, source):
        return stand_ins.setdefault(id(source), GatherStandIn(tensors, source))

    if moved_by == "reads":
        monkeypatch.setattr(
            slot_pool.SlotPool,
            "gather_source",
            lambda pool, layer: (stand_in(pool.tensors, pool.layers[layer]), None),
        )
    else:  # the pool's own gathered layers, with kernels reaching the files' host mappings
        monkeypatch.setattr(slot_pool, "landing_for", lambda *args: HostLanding())
        monkeypatch.setattr(
            settle,
            "gather_kernel",
            lambda tensors, source, bases: (stand_in(tensors, source), host_sources(source, bases)),
        )
        monkeypatch.setattr(settle, "FILL_ON_GPU", True)
        monkeypatch.setattr(cuda_gather, "SlotFill", lambda tensors: fill[0])
    model, tokenizer = streamer.load(
        folder, memory_budget=slots * slot_bytes(folder), read_path="slots"
    )
    fill.append(HostFill(model.streamer.pools[0]))
    return model, tokenizer, stand_ins, fill[0]


@pytest.mark.parametrize("settle_tokens", [1, 3])
@pytest.mark.parametrize("moved_by", ["reads", "fill"])
def test_gathered_decode_matches_the_resident_model(
    float32_model, monkeypatch, settle_tokens, moved_by
):
    """CUDA's gathered calls (no sync: the GPU takes misses from the pinned files), here with a
    stand-in for the kernel: 6 slots for 2 layers x top-4 of 16 experts, so most settles move
    slots, and the tables must follow every move. Decode never syncs; the prompt does (too
    many routes for one stack). Moved experts reach their slots by reads after the fence, or
    (CUDA's default) by the fill kernel queued behind the pool's readers, here a stand-in that
    copies from the files' host mappings (test_slot_pool.py HostFill)."""
    src, folder = float32_model
    monkeypatch.setattr(settle, "SETTLE_TOKENS", settle_tokens)
    model, tokenizer, stand_ins, fill = gathered_model(monkeypatch, folder, 6, moved_by)
    (pool,) = model.streamer.pools
    prompt = mx.array(tokenizer.encode(PROMPT))
    tokens, reference = 24, reference_model(src)
    assert greedy_tokens(model, prompt, tokens) == greedy_tokens(reference, prompt, tokens)
    decode, prefill = model.streamer.stats.decode, model.streamer.stats.prefill
    assert decode.syncs == 0 and prefill.syncs == 2  # one prompt call a layer
    assert sum(s.calls for s in stand_ins.values()) == decode.layer_calls >= 2 * (tokens - 1)
    # counted at the settles (and the last few when the stats are read): what the GPU did
    assert decode.cache_hits == sum(s.hits for s in stand_ins.values()) > 0
    assert decode.experts_read == sum(s.misses for s in stand_ins.values()) > 0
    assert pool.version > 1  # settles moved slots (the last few routings wait for the next one)
    if moved_by == "fill":  # the prompt's misses (a launch a layer), then a launch a settle
        assert len(fill.moves) > 2 and all(fill.moves)
    model.streamer.close()  # the stand-in landing's mappings go with it, not at the next collection


def test_settles_that_copy_nothing_leave_one_output_waited_for(float32_model, monkeypatch):
    """28 slots for 2 x 16 experts: once the pool holds what decode routes, settles copy nothing.
    Every gathered call's output is listed for the next write to wait for; a settle that copies
    nothing queues them and lists one array that waits for them all, so the list does not grow
    with every call of a long generation (it held 673 outputs after 800 tokens here before)."""
    src, folder = float32_model
    model, tokenizer, _, fill = gathered_model(monkeypatch, folder, 28, "fill")
    (pool,) = model.streamer.pools
    listed = []
    settled = pool.settle

    def counted(behind: int = 0):
        settled(behind)
        listed.append(len(pool._pending))

    monkeypatch.setattr(pool, "settle", counted)
    prompt = mx.array(tokenizer.encode(PROMPT))
    assert greedy_tokens(model, prompt, 400) == greedy_tokens(reference_model(src), prompt, 400)
    assert len(listed) > 20 and max(listed) == 1 and len(fill.moves) < len(listed)
    model.streamer.close()


@pytest.mark.parametrize(
    ("stack", "text"), [("fits", PROMPT), ("fits", "Files hold"), ("too large", PROMPT)]
)
def test_a_prompt_is_gathered_whole_when_a_layers_experts_fit_the_pool(
    float32_model, monkeypatch, stack, text
):
    """A call routing more entries than a decode stack (a prompt) is gathered too when every
    expert of its layer fits the pool: the stand-in makes a row per expert of the layer, those
    the prompt routes from their slots or the files and the rest left unwritten (NaN bits, which
    a short prompt's logits would show if read), the container computes on them with the
    prompt's own indices (as on the resident weights), and nothing syncs. The prompt's experts,
    all read from the files on a cold pool, are counted at the first settle. A layer whose
    experts would make a stack past STACK_BYTES (a DeepSeek's 5.6 GB at 4 bits) syncs instead."""
    src, folder = float32_model
    monkeypatch.setattr(slot_calls, "WHOLE_PROMPTS", True)
    if stack == "too large":
        monkeypatch.setattr(slot_calls, "STACK_BYTES", 16 * slot_bytes(folder) - 1)
    stand_ins = {}

    def stand_in(pool, layer):
        return stand_ins.setdefault(layer, GatherStandIn(pool.tensors, pool.layers[layer])), None

    monkeypatch.setattr(slot_pool.SlotPool, "gather_source", stand_in)
    model, tokenizer = streamer.load(
        folder, memory_budget=16 * slot_bytes(folder), read_path="slots"
    )
    (pool,) = model.streamer.pools
    assert pool.slots == 16
    prompt = mx.array(tokenizer.encode(text))
    tokens, reference = 8, reference_model(src)
    assert greedy_tokens(model, prompt, tokens) == greedy_tokens(reference, prompt, tokens)
    prefill, decode = model.streamer.stats.prefill, model.streamer.stats.decode
    if stack == "too large":  # one synced call a layer
        assert prefill.syncs == 2 and prefill.gathered == decode.syncs == 0
        model.streamer.close()
        return
    assert prefill.syncs == decode.syncs == 0 and prefill.gathered == 2
    # a cold pool: every routed expert read from the files; the rest's rows left unwritten
    unwritten = sum(s.unwanted[0] for s in stand_ins.values())  # the first call: the prompt's
    assert prefill.experts_read + unwritten == 2 * 16 and prefill.cache_hits == 0
    assert (unwritten > 0) == (text != PROMPT)  # every expert routed by the long prompt
    assert decode.cache_hits > 0 and pool.version >= 1  # the prompt's experts settled into slots
    model.streamer.close()


def test_forward_passes_built_before_either_is_evaluated(float32_model):
    """MLX is lazy: the second pass rewrites slots that the first pass's graph still has to read.
    The pool evaluates the first pass's expert outputs before it writes (its fence)."""
    src, folder = float32_model
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path="slots")
    assert model.streamer.pools[0].slots == 16  # budget 0: one layer's experts
    reference = reference_model(src)
    first = mx.array(tokenizer.encode(PROMPT))[None]
    second = mx.array(tokenizer.encode("An entirely different prompt about files."))[None]
    ours = [model(first), model(second)]  # nothing evaluated between them
    assert mx.array_equal(ours[0], reference(first))
    assert mx.array_equal(ours[1], reference(second))


def mapped_span(where) -> int:
    """Bytes of this process's address space that map files under `where` (0 off Linux)."""
    if sys.platform != "linux":
        return 0
    spans = [line.split()[0].split("-") for line in open("/proc/self/maps") if str(where) in line]
    return sum(int(end, 16) - int(start, 16) for start, end in spans)


def test_the_slot_path_never_maps_an_expert_file(float32_model, monkeypatch):
    """Reads go into the slots (on CUDA: through pinned staging, asked for here; its default
    maps the files read-only for the copy engine and the gather kernel, cache/landing.py)."""
    _, folder = float32_model
    gc.collect()  # models of earlier tests (on CUDA the default maps their files) are gone
    # what they leave: a mapped buffer that malloc keeps in its heap keeps its file mapped
    before = mapped_span(folder / "experts")
    model, tokenizer = streamer.load(
        folder, memory_budget=0, read_path="slots", cuda_misses="staged"
    )
    assert model.streamer.plan.cuda_misses == "staged"
    streamer.generate(model, tokenizer, PROMPT, max_tokens=4)
    assert model.streamer.files is None and model.streamer.mapped_mlx_bytes == 0
    assert mapped_span(folder / "experts") <= before  # nothing of the files mapped anew
    assert "read path slots (asked for)" in model.streamer.residency


def test_read_path_defaults_by_backend_and_refuses_mapped_on_cuda(monkeypatch):
    with pytest.raises(StreamerError, match="read_path must be one of slots, mapped"):
        backends.read_path_for_backend("pool")
    for backend, default in (("cpu", "mapped"), ("metal", "slots"), ("cuda", "slots")):
        monkeypatch.setattr(backends, "backend", lambda b=backend: b)
        path, why = backends.read_path_for_backend(None)
        assert path == default and backend in why.lower()
    with pytest.raises(StreamerError, match="does not run on MLX's CUDA backend"):
        backends.read_path_for_backend("mapped")


def test_cli_read_path(float32_model):
    _, folder = float32_model
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "generate", "--model", str(folder), "--prompt", "The",
         "--max-tokens", "3", "--read-path", "slots", "--memory-budget", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "read path slots" in result.stderr.splitlines()[0]
