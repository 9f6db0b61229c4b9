"""A load's residency plan (loading/residency.py) is made once, from one reading of the memory
available; the layers only apply it, `model.streamer.residency` says it, and `streamer plan` makes
the same plan from the folder's files without loading it."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest

import streamer
from streamer.cache.budget import SLOT_SHARE, all_experts_bytes
from streamer.cli import main
from streamer.io.manifest import read_manifest
from streamer.loading import load as loading
from streamer.plan import plan


def fake_memory(monkeypatch, nbytes: int) -> list:
    calls = []
    monkeypatch.setattr(loading, "available_memory", lambda: calls.append(nbytes) or nbytes)
    return calls


@pytest.mark.parametrize("read_path", ["slots", "mapped"])
@pytest.mark.parametrize("source", ["repacked", "download"])
def test_one_memory_reading_makes_the_whole_plan(checkpoints, monkeypatch, read_path, source):
    folder = checkpoints.mlx("qwen3_moe")
    if source == "repacked":
        folder = checkpoints.repacked(folder)
    calls = fake_memory(monkeypatch, 1 << 16)  # less than the experts: a pool, or the page cache
    model, _ = streamer.load(folder, read_path=read_path)
    assert len(calls) == 1
    held = model.streamer.plan
    assert held.available == 1 << 16 and held.read_path == read_path
    assert held.form == ("slot pool" if read_path == "slots" else "page cache")
    assert model.streamer.residency == held.text()
    if read_path == "slots":  # the pools made are the ones planned
        assert sum(p.nbytes for p in model.streamer.pools) == held.pool_bytes
        assert [p.slots for p in model.streamer.pools] == [
            group.slots for shape in held.classes for group in shape.groups
        ]
    model.streamer.close()


def test_the_plan_command_makes_the_plan_a_load_makes(checkpoints, monkeypatch, capsys):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    need = all_experts_bytes(read_manifest(folder), mx.float32)
    fake_memory(monkeypatch, need)  # every expert fits, not in the slot path's share
    memory = need + plan(folder, need, dtype=mx.float32).resident_bytes
    planned = plan(folder, memory, dtype=mx.float32).plans
    for read_path in ("slots", "mapped"):
        model, _ = streamer.load(folder, read_path=read_path, dtype=mx.float32)
        held = model.streamer.plan
        model.streamer.close()
        assert held.read_path_why == "asked for"
        assert dataclasses.replace(planned[read_path], read_path_why="asked for") == held
    assert planned["slots"].form == "slot pool" and planned["slots"].budget == int(
        need * SLOT_SHARE
    )
    assert planned["mapped"].form == "page cache"
    assert main(["plan", str(folder), "--memory", str(memory)]) == 0
    out = capsys.readouterr().out
    for read_path in ("slots", "mapped"):
        said = planned[read_path].text()
        assert f"residency ({read_path})" in out and said in out
