"""A load's residency plan (loading/residency.py) is made once, from one reading of the memory
available; the layers only apply it, `model.streamer.residency` says it, and `streamer plan` makes
the same plan from the folder's files without loading it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import mlx.core as mx
import pytest

import streamer
from streamer.cache import landing
from streamer.cache.budget import SLOT_SHARE, all_experts_bytes
from streamer.cli import main
from streamer.errors import StreamerError
from streamer.io import cuda_copy, cuda_runtime
from streamer.io.manifest import read_manifest
from streamer.loading import backend as backends
from streamer.loading import load as loading
from streamer.loading import residency
from streamer.loading.backend import Memory
from streamer.loading.residency import PINNED_SHARE, LayerShape, plan_residency
from streamer.plan import plan


def fake_memory(monkeypatch, nbytes: int) -> list:
    calls = []
    monkeypatch.setattr(loading, "available_memory", lambda: calls.append(nbytes) or Memory(nbytes))
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
    assert held.memory.available == 1 << 16 and held.read_path == read_path
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
    memory reading (PINNED_SHARE of it), one allowance shared by the slot pools' landings (each
    had its own: several pools locked several times it); a resident layer's pool, read once and
    closed before the next, has its own. Here the CUDA check and the copy classes are fakes that
    record what they are given: no CUDA code runs. Chunks of one slot: a pool per layer."""
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    calls = fake_memory(monkeypatch, memory)
    monkeypatch.setattr(residency, "CHUNK_BYTES", 1)
    made = []
    monkeypatch.setattr(landing, "backend", lambda: "cuda")
    monkeypatch.setattr(cuda_runtime, "CudaRuntime", lambda: "runtime")
    monkeypatch.setattr(cuda_copy, "MappedCopies", lambda *args, **kw: made.append(args) or None)
    monkeypatch.setattr(cuda_copy, "StagedCopies", lambda *args: pytest.fail("not asked for"))
    model, _ = streamer.load(folder, read_path="slots")  # cuda_misses: "gathered"
    held = model.streamer.plan
    model.streamer.close()
    assert len(calls) == 1 and held.pinnable == int(memory * PINNED_SHARE)
    assert held.form == ("slot pool" if memory == 1 << 16 else "resident")
    pools = len(model.streamer.pools) if held.form == "slot pool" else len(model.streamer.layers)
    assert pools > 1 and [args[:2] for args in made] == [("runtime", "file")] * pools
    allowances = {id(args[2]): args[2] for args in made}.values()
    assert len(allowances) == (1 if held.form == "slot pool" else pools)
    assert all(allowance.left == held.pinnable for allowance in allowances)


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


GIB = 1 << 30


def fake_machine(monkeypatch, where: str, host: int, **device) -> None:
    """A `where` backend (this machine's is the CPU) with `host` bytes of RAM available, and
    what mx.device_info reports there (`free_memory` on CUDA, Metal's working set), MLX holding
    2 GiB of it under a 100 GiB memory limit unless `limit` says otherwise."""
    monkeypatch.setattr(backends, "backend", lambda: where)
    monkeypatch.setattr(backends.psutil, "virtual_memory", lambda: SimpleNamespace(available=host))
    monkeypatch.setattr(mx, "device_info", lambda: {"device_name": where, **device})
    monkeypatch.setattr(mx, "get_active_memory", lambda: 2 * GIB)
    monkeypatch.setattr(mx, "get_memory_limit", lambda: device.get("limit", 100 * GIB))


def test_the_memory_read_is_the_one_the_experts_live_in(monkeypatch):
    """On CUDA every resident expert and the slot pool are in GPU memory: the plan was made from
    the host's RAM (64 GiB here) against a GPU with 10 GiB free. On Metal (unified) it is the
    host's within the recommended working set, less what MLX already holds."""
    fake_machine(monkeypatch, "cpu", 64 * GIB)
    assert backends.available_memory() == Memory(64 * GIB)
    fake_machine(monkeypatch, "cuda", 64 * GIB, free_memory=10 * GIB)
    assert backends.available_memory() == Memory(10 * GIB, "GPU memory", 64 * GIB)
    fake_machine(monkeypatch, "cuda", 64 * GIB, free_memory=10 * GIB, limit=8 * GIB)
    assert backends.available_memory().available == 6 * GIB  # within MLX's limit, less its own
    fake_machine(monkeypatch, "metal", 64 * GIB, max_recommended_working_set_size=48 * GIB)
    assert backends.available_memory() == Memory(46 * GIB, "GPU memory (Metal's working set)")
    fake_machine(monkeypatch, "metal", 20 * GIB, max_recommended_working_set_size=48 * GIB)
    assert backends.available_memory() == Memory(20 * GIB)  # other programs hold the rest


def test_cuda_locks_files_in_the_hosts_memory_not_the_gpus():
    """The landing page-locks expert files in host RAM: its allowance is a share of that."""
    shapes = [LayerShape(0, (), 4, 1 << 20, 1 << 20)]
    on_gpu = plan_residency(shapes, 0, "mapped", "asked", Memory(GIB, "GPU memory", 64 * GIB))
    assert on_gpu.pinnable == int(64 * GIB * PINNED_SHARE)
    assert plan_residency(shapes, 0, "mapped", "asked", Memory(GIB)).pinnable == GIB // 2


def test_a_pool_past_the_gpus_free_memory_is_refused_naming_it(checkpoints, monkeypatch):
    """On CUDA a load whose pool fits the host's RAM but not the GPU's free memory was made (to
    fail at the GPU's allocation, or page); refused now, naming the GPU's memory and its size,
    without the mapped path to try (CUDA has none)."""
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    fake_machine(monkeypatch, "cuda", 64 * GIB, free_memory=1024)
    with pytest.raises(StreamerError) as refused:
        streamer.load(folder, memory_budget=0)
    said = str(refused.value)
    assert said.startswith("a slot pool, ") and "memory budget 0 B" in said
    assert said.endswith(
        "does not fit in the 1.00 KiB of GPU memory available: it is budget 0's, the smallest; "
        "free GPU memory."
    )


def test_the_plan_command_plans_for_the_gpus_memory(checkpoints, monkeypatch, capsys):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    fake_machine(monkeypatch, "cuda", 64 * GIB, free_memory=10 * GIB)
    assert main(["plan", str(folder)]) == 0
    assert " tokens in 10.00 GiB" in capsys.readouterr().out
