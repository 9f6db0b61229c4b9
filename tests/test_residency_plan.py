"""A load's residency plan (loading/residency.py) is made once, from one reading of the memory
available; the layers only apply it, `model.streamer.residency` says it, and `streamer plan` makes
the same plan from the folder's files without loading it."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest

import streamer
from streamer.cache import landing
from streamer.cache.budget import SLOT_SHARE, all_experts_bytes
from streamer.cli import main
from streamer.io import cuda_copy, cuda_runtime
from streamer.io.manifest import read_manifest
from streamer.loading import load as loading
from streamer.loading.residency import PINNED_SHARE
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
    assert model.streamer.residency.startswith(f"{held.text()}; matmuls on ")
    if read_path == "slots":  # the pools made are the ones planned
        assert sum(p.nbytes for p in model.streamer.pools) == held.pool_bytes
        assert [p.slots for p in model.streamer.pools] == [
            group.slots for shape in held.classes for group in shape.groups
        ]
    model.streamer.close()


@pytest.mark.parametrize("memory", [1 << 16, 1 << 40])  # a slot pool; every layer resident
def test_the_cuda_landing_locks_what_the_plan_allows(checkpoints, monkeypatch, memory):
    """The bytes of expert files CUDA's landing may page-lock whole come from the plan's one
    memory reading (PINNED_SHARE of it), down to every pool's landing; here the CUDA check and
    the copy classes are fakes that record what they are given: no CUDA code runs."""
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    calls = fake_memory(monkeypatch, memory)
    made = []
    monkeypatch.setattr(landing, "on_cuda", lambda: True)
    monkeypatch.setattr(cuda_runtime, "CudaRuntime", lambda: "runtime")
    monkeypatch.setattr(cuda_copy, "MappedCopies", lambda *args, **kw: made.append(args) or None)
    monkeypatch.setattr(cuda_copy, "StagedCopies", lambda *args: pytest.fail("not asked for"))
    model, _ = streamer.load(folder, read_path="slots")  # cuda_misses: "gathered"
    held = model.streamer.plan
    model.streamer.close()
    assert len(calls) == 1 and held.pinnable == int(memory * PINNED_SHARE)
    assert held.form == ("slot pool" if memory == 1 << 16 else "resident")
    pools = len(model.streamer.pools) if held.form == "slot pool" else len(model.streamer.layers)
    assert pools > 0 and made == [("runtime", "file", held.pinnable)] * pools


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
