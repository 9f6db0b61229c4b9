"""A decode call's hits computed while its misses are read (experts/slots.py, OVERLAPPED_ROUTES):
the hits' entries are queued before the first miss is read and the misses' after, and the two
parts go back in routed order, so every step's logits are the resident model's to the bit.
Prompt calls stay one container call."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import ARCHS, reference_model
from mlx_lm.models.cache import make_prompt_cache
from test_parity import PROMPT
from test_slots import slot_bytes

import streamer
from streamer.cache.slot_pool import SlotPool
from streamer.experts import slots as slot_calls


def stepwise_logits(model, prompt: mx.array, steps: int) -> list[mx.array]:
    """The prompt's last logits, then each greedy step's, through a KV cache."""
    cache = make_prompt_cache(model)
    logits = model(prompt[None], cache=cache)[:, -1]
    out = [logits]
    for _ in range(steps):
        token = mx.argmax(logits, axis=-1)[None]
        logits = model(token, cache=cache)[:, -1]
        out.append(logits)
    mx.eval(out)
    return out


def overlapped_load(folder, slots: int, monkeypatch):
    monkeypatch.setattr(slot_calls, "GATHERED_ROUTES", 0)  # every call synced, on CUDA too
    # overlapped on any backend (a GPU's default is serial): these tests check it there too
    monkeypatch.setattr(slot_calls, "overlapped_routes", lambda: slot_calls.OVERLAPPED_ROUTES)
    return streamer.load(folder, memory_budget=slots * slot_bytes(folder), read_path="slots")


def test_hits_are_queued_before_the_misses_are_read(checkpoints, monkeypatch):
    """qwen3_moe (top-4 of 16, 2 layers) on a 16-slot pool: decode calls with hits and misses. Each
    such call queues its hits' part before the pool reads a miss, no prompt call is split, and
    every step's logits are the resident model's exactly."""
    src = checkpoints.mlx("qwen3_moe", dtype="float32")
    folder = checkpoints.repacked(src)
    events: list[str] = []
    hits_first, read_misses = slot_calls.Slots._hits_first, SlotPool._read_misses

    def spying_hits_first(self, layer, x, routed, experts, hits, traffic, slots, missed):
        assert routed.size <= slot_calls.OVERLAPPED_ROUTES  # a decode call, not the prompt
        hits_first(self, layer, x, routed, experts, hits, traffic, slots, missed)
        events.append("hits" if hits else "no hits")

    def spying_read_misses(self, layer, reads):
        events.append("read")
        return read_misses(self, layer, reads)

    monkeypatch.setattr(slot_calls.Slots, "_hits_first", spying_hits_first)
    monkeypatch.setattr(SlotPool, "_read_misses", spying_read_misses)
    model, tokenizer = overlapped_load(folder, 16, monkeypatch)
    prompt = mx.array(tokenizer.encode(PROMPT))
    streamed = stepwise_logits(model, prompt, 24)
    resident = stepwise_logits(reference_model(src), prompt, 24)
    assert all(mx.array_equal(a, b) for a, b in zip(streamed, resident))
    overlapped = [i for i, e in enumerate(events) if e == "hits"]
    assert len(overlapped) > 10  # decode calls that computed hits beside their reads
    assert all(events[i + 1] == "read" for i in overlapped)  # queued before the first read


@pytest.mark.parametrize("arch", ARCHS)
def test_every_family_overlapped_matches_the_resident_model(checkpoints, arch, monkeypatch):
    """Whatever the family's expert container, a pool of 8 slots with hits computed beside the
    misses' reads gives the resident model's logits at every decode step."""
    src = checkpoints.mlx(arch, dtype="float32")
    model, tokenizer = overlapped_load(checkpoints.repacked(src), 8, monkeypatch)
    prompt = mx.array(tokenizer.encode(PROMPT))
    streamed = stepwise_logits(model, prompt, 8)
    resident = stepwise_logits(reference_model(src), prompt, 8)
    assert all(mx.array_equal(a, b) for a, b in zip(streamed, resident))


def test_only_the_cpu_backend_overlaps_by_default(monkeypatch):
    """Measured faster and exact on the CPU only; on a GPU a call computes in one part."""
    assert slot_calls.overlapped_routes() == (
        slot_calls.OVERLAPPED_ROUTES if mx.default_device() == mx.cpu else 0
    )
    monkeypatch.setattr(mx, "default_device", lambda: mx.gpu)
    assert slot_calls.overlapped_routes() == 0
    monkeypatch.setattr(mx, "default_device", lambda: mx.cpu)
    assert slot_calls.overlapped_routes() == slot_calls.OVERLAPPED_ROUTES > 0
