"""A generation stopped part way (Ctrl-C, an error) leaves the model as a fresh one would answer:
a slot the pool gave an expert but never filled must not be taken as holding it."""

from __future__ import annotations

import errno
import threading

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache
from test_slot_pool import pool_over, slot_bytes

import streamer
from streamer.api_request import leveled
from streamer.cache.slot_pool import SlotPool
from streamer.errors import StreamerError
from streamer.experts import slots as slot_calls
from streamer.io import mapping, reads
from streamer.io.manifest import read_manifest
from streamer.loading import residency

PROMPT = "hello world, this is a prompt about things"


def answer(model, tokenizer) -> list[int]:
    return [r.token for r in streamer.stream_generate(model, tokenizer, PROMPT, 8)]


def stop_once(owner, name: str, at_call: int, monkeypatch) -> None:
    """`owner.name` raises KeyboardInterrupt on its `at_call`th call (a Ctrl-C arriving there)."""
    original, calls = getattr(owner, name), [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at_call:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)


def test_ctrl_c_between_choosing_slots_and_reading_them_empties_them(tmp_path):
    pool, truth = pool_over(tmp_path, slots=2)
    pool.place(0, np.array([0, 1]))

    def ctrl_c(slots, missed):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # experts 2 and 3 take the slots of 0 and 1
        pool.place(0, np.array([2, 3]), while_reading=ctrl_c)
    assert (pool.policy.slot_key == -1).all() and (pool.policy.slot_of == -1).all()
    slots, misses = pool.place(0, np.array([2, 3]))
    assert misses == 2
    for expert, slot in zip([2, 3], slots):
        assert all(map(np.array_equal, slot_bytes(pool, slot), truth[0][expert]))
    pool.close()


def test_a_ctrl_c_while_readers_fill_slots_is_raised_once_every_read_has_finished(
    tmp_path, monkeypatch
):
    """A reader left writing would land its expert's bytes in a slot a later call reads another
    expert into. Here the readers hold until the pool waits for them a second time."""
    pool, _ = pool_over(tmp_path, slots=2)
    waited_again, finished = threading.Event(), []
    read_piece, wait = SlotPool._read_piece, reads.wait

    def held_read(self, *args):
        waited_again.wait()
        read_piece(self, *args)
        finished.append(args)

    waits = []

    def ctrl_c_at_first_wait(futures):
        waits.append(futures)
        if len(waits) == 1:
            raise KeyboardInterrupt
        waited_again.set()
        return wait(futures)

    monkeypatch.setattr(SlotPool, "_read_piece", held_read)
    monkeypatch.setattr(reads, "wait", ctrl_c_at_first_wait)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.place(0, np.array([0, 1]))  # two misses: two readers
        assert len(finished) == 2
    finally:
        waited_again.set()  # without the second wait the readers would hold for ever
    pool.close()


def test_ctrl_c_while_a_settle_waits_to_read_empties_the_slots_it_moved(tmp_path, monkeypatch):
    """A gathered call's routing replayed later (cache/settle.py): the policy moves first, the
    reads follow once the kernels reading the old slots have run."""
    pool, _ = pool_over(tmp_path, slots=4)
    pool.defer(0, mx.array(np.array([[2, 3]], dtype=np.uint32)), lambda experts: None)
    stop_once(pool, "fence", 1, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        pool.settle()
    assert (pool.policy.slot_key == -1).all() and (pool.policy.slot_of == -1).all()
    pool.close()


@pytest.mark.parametrize("source", ["repacked", "in place"])
def test_a_generation_stopped_before_its_reads_leaves_the_next_one_a_fresh_models(
    checkpoints, monkeypatch, source
):
    download = checkpoints.mlx("qwen3_moe")
    folder = checkpoints.repacked(download) if source == "repacked" else download
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path="slots")
    fresh, _ = streamer.load(folder, memory_budget=0, read_path="slots")
    with monkeypatch.context() as patch:
        stop_once(SlotPool, "_read_misses", 3, patch)
        with pytest.raises(KeyboardInterrupt):
            answer(model, tokenizer)
    assert answer(model, tokenizer) == answer(fresh, tokenizer)


@pytest.mark.parametrize("source", ["repacked", "in place"])
def test_a_disk_error_on_the_mapped_path_names_the_file_and_the_next_answer_is_right(
    checkpoints, monkeypatch, source
):
    """Populating a mapping failed as a bare OSError ([Errno 5] Input/output error): no file."""
    download = checkpoints.mlx("qwen3_moe")
    folder = checkpoints.repacked(download) if source == "repacked" else download
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path="mapped")
    fresh, _ = streamer.load(folder, memory_budget=0, read_path="mapped")

    def failing(address, offset, length):
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(mapping, "populate", failing)
        with pytest.raises(
            StreamerError, match=r"\(MoE layer 0, .*\): cannot read bytes .* \(\[Errno 5\]"
        ):
            answer(model, tokenizer)
    assert answer(model, tokenizer) == answer(fresh, tokenizer)


def test_a_prompt_cache_stopped_inside_a_step_holds_no_layer_a_step_ahead(checkpoints, monkeypatch):
    """A Ctrl-C during an expert read in the prompt's step: layer 0 had taken the step, layer 1
    not (offsets 21 and 20), and the next answer ran each layer at other positions."""
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path="slots")
    cache = make_prompt_cache(model)
    with monkeypatch.context() as patch:
        stop_once(SlotPool, "_read_misses", 3, patch)
        with pytest.raises(KeyboardInterrupt):
            list(streamer.stream_generate(model, tokenizer, PROMPT, 8, prompt_cache=cache))
    held = {c.offset for c in cache}
    assert len(held) == 1
    fresh, _ = streamer.load(folder, memory_budget=0, read_path="slots")
    fresh_cache = make_prompt_cache(fresh)
    mx.eval(fresh(mx.array([tokenizer.encode(PROMPT)[: held.pop()]]), cache=fresh_cache))

    def then(model, cache):
        responses = streamer.stream_generate(model, tokenizer, " and more", 8, prompt_cache=cache)
        return [r.token for r in responses]

    assert then(model, cache) == then(fresh, fresh_cache)


def kv_cache(positions: int) -> KVCache:
    cache = KVCache()
    keys = mx.zeros((1, 1, positions, 4))
    cache.update_and_fetch(keys, keys)
    return cache


def test_a_hybrid_cache_stopped_inside_a_step_is_left_as_mlx_lm_leaves_it():
    """Its recurrent state has no positions to trim back: trimming the attention layers alone
    would leave it as wrong, another way."""
    attention = [kv_cache(3), kv_cache(2)]
    leveled(attention)
    assert [c.offset for c in attention] == [2, 2]
    hybrid = [kv_cache(3), ArraysCache(2), kv_cache(2)]
    leveled(hybrid)
    assert [hybrid[0].offset, hybrid[2].offset] == [3, 2]


def test_a_ctrl_c_while_a_stack_is_computed_on_names_no_chunk_installed(checkpoints, monkeypatch):
    """A call across chunks computes on a stack installed in the container (a GPU's way); the
    container still held it after a Ctrl-C, while the layer named chunk 0 installed, so a later
    call on chunk 0 computed on the stack's rows."""
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe", dtype="float32"))
    largest = max(t.nbytes for t in read_manifest(folder).layers[0].tensors)
    monkeypatch.setattr(residency, "CHUNK_BYTES", 3 * largest)  # a pool of 6 chunks
    monkeypatch.setattr(slot_calls, "stack_bytes", lambda: slot_calls.STACK_BYTES)
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path="slots")
    (pool,) = model.streamer.pools
    with monkeypatch.context() as patch:  # the 5th: the layers' first calls named chunk 0
        stop_once(type(model.streamer.layers[0].container), "__call__", 5, patch)
        with pytest.raises(KeyboardInterrupt):
            answer(model, tokenizer)
    for layer in model.streamer.layers:
        installed = layer.compute_mode._installed
        if installed is not None:  # the chunk it names is the one the container holds
            held = [layer.container[p][k] for p, k in layer._slots]
            assert all(t is a for t, a in zip(held, pool.chunks[installed]))
