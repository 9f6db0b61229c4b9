"""The largest published MoE shapes at their real sizes: sparse MLX 4-bit downloads of DeepSeek-V3,
Kimi K2, Qwen3-235B-A22B, GLM-4.5 and gpt-oss-120b (fixtures/published_shapes.py; every tensor
name, shape, shard and size as `mlx_lm.convert -q` writes them, the data a hole: no disk is used,
reads return zeros, so the outputs are zeros. Exactness is tested at small sizes; this is whether
the real sizes run at all: Kimi K2's 2.8 GB stacked tensors, pools in chunks, 94 layers).

At full depth (36-94 layers, 130-578 GB) each download is planned, parsed and every expert tensor
mapped, counting the work: bytes read, mappings, descriptors. One token is generated on both read
paths from one MoE layer only (gpt-oss: two, its sliding and its full attention; the dense first
layers of Kimi K2 and GLM-4.5 left out), every width real: at full depth the resident weights
alone are 3-12 GB of zeros to read into memory, too much memory and time for a test, and every MoE
layer of a family has the same shapes. Each such test takes 5-15 s here (reading the embedding and
output projection, and computing the latter: vocabulary x width at real size); DeepSeek-V3 is
Kimi K2's architecture with smaller expert tensors, so only Kimi K2 generates."""

from __future__ import annotations

import gc
import struct
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import psutil
import pytest
from mlx.utils import tree_flatten

import streamer
from fixtures.published_shapes import PUBLISHED_SHAPES, text_config, with_size
from streamer.io.expert_files import ExpertFiles
from streamer.loading.assembly import load_resident
from streamer.loading.download_folder import layouts, open_download
from streamer.loading.pools import open_pools
from streamer.loading.residency import PoolGroup
from streamer.plan import plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # scripts, not a package
from generate_checkpoint import write_checkpoint  # noqa: E402

SHAPES = ["deepseek-v3", "kimi-k2", "qwen3-235b-a22b", "glm-4.5", "gpt-oss-120b"]
MAX_MAP_COUNT = 65530  # Linux's default vm.max_map_count


def header_length(path: Path) -> int:
    with open(path, "rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def dense_layers(config: dict) -> int:
    return text_config(config).get("first_k_dense_replace", 0)  # DeepSeek's and GLM's field


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    made = {}

    def download(name: str, layers: int | None = None) -> Path:
        config = PUBLISHED_SHAPES[name]
        if layers is not None:  # that many MoE layers
            config = with_size(config, layers=layers)
            if "first_k_dense_replace" in config:
                config = {**config, "first_k_dense_replace": 0}
        key = (name, layers)
        if key not in made:
            folder = tmp_path_factory.mktemp(name) / "download"
            made[key] = write_checkpoint(folder, config, sparse=True, log=lambda _: None)
        return made[key]

    return download


@pytest.mark.parametrize("name", SHAPES)
def test_full_depth_plans_parses_and_maps_with_bounded_work(downloads, name):
    """Parsing reads the headers and little else; each stacked expert tensor is one mapping (at
    most three entries in the process's map: the file, the MLX buffer's spare bytes before and
    after it), far below Linux's vm.max_map_count; descriptors are one per shard, on either read
    path."""
    folder = downloads(name)
    config = text_config(PUBLISHED_SHAPES[name])
    layers = config["num_hidden_layers"] - dense_layers(config)
    found = plan(folder, 24 << 30)
    assert found.moe_layers == layers and found.runs
    process = psutil.Process()
    shards = sorted(folder.glob("*.safetensors"))
    headers = sum(8 + header_length(path) for path in shards)
    read = process.io_counters().read_chars
    download, _, _ = open_download(folder)
    read = process.io_counters().read_chars - read
    small = sum(p.stat().st_size for p in folder.glob("*.json"))
    assert read < 2 * (headers + small) + (1 << 20)  # no tensor data: it is lazy
    maps, fds = len(process.memory_maps(grouped=False)), process.num_fds()
    files = ExpertFiles(layouts(download))
    tensors = sum(len(layer.tensors) for layer in download.layers)
    expert_shards = {t.file for layer in download.layers for t in layer.tensors}
    assert len(download.layers) == layers and files.mapped_bytes > 0.9 * found.expert_bytes
    mapped = len(process.memory_maps(grouped=False)) - maps
    assert mapped <= 3 * tensors and maps + mapped < MAX_MAP_COUNT // 8
    assert process.num_fds() - fds == len(expert_shards)
    files.close()
    fds = process.num_fds()
    placed = layouts(download)
    pools = open_pools(placed, [PoolGroup(tuple(p.index for p in placed), 1, 1)], None)
    assert process.num_fds() - fds == len(expert_shards)  # each shard opened once, not per tensor
    next(iter(pools.values())).close()


@pytest.mark.parametrize("name", [name for name in SHAPES if name != "deepseek-v3"])
def test_one_moe_layer_generates_a_token_on_both_read_paths(downloads, name):
    """At 512 MB the slot pool is a fraction of one MoE layer's experts (Kimi K2's 8.6 GB), so
    the token's routed experts are read into it; on the mapped path they are computed in place."""
    config = PUBLISHED_SHAPES[name]
    folder = downloads(name, 2 if name == "gpt-oss-120b" else 1)
    for read_path, budget in (("mapped", 0), ("slots", "512M")):
        model, _ = streamer.load(folder, read_path=read_path, memory_budget=budget)
        logits = model(mx.array([[1]]))
        assert logits.shape == (1, 1, text_config(config)["vocab_size"])
        assert mx.all(logits == 0).item()  # zeros in, zeros out: every tensor was a hole
        token = model.streamer.stats.decode  # one token: counted as decode
        assert token.layer_calls == len(model.streamer.layers)  # one call per MoE layer
        if read_path == "slots":
            (pool,) = model.streamer.pools
            assert pool.nbytes <= 512 * 2**20 and token.experts_read > 0
        model.streamer.close()
        del model


def test_the_weights_as_read_are_freed_once_cast():
    """What the engine held beyond the weights, the pool and the mapped files at real shapes
    (35-73 KB per expert, 1.1 GB for a full GLM-4.5) was the non-expert weights as read, in
    bfloat16, kept beside their float32 casts until the load returned. Held now: the casts."""
    model = nn.Sequential(nn.Linear(512, 512), nn.RMSNorm(512))
    mx.eval(model.parameters())
    gc.collect()  # other tests' arrays: freed before, not during
    before = mx.get_active_memory()
    weights = {n: mx.ones(v.shape, mx.bfloat16) for n, v in tree_flatten(model.parameters())}
    as_read = sum(v.nbytes for v in weights.values())
    load_resident(model, weights, mx.float32, str)  # read lazily as mx.load reads: on eval
    gc.collect()
    # float32 in place of float32 (a few KB may be anything else the process holds since)
    assert not weights and mx.get_active_memory() - before < as_read // 4
    assert mx.get_cache_memory() == 0  # nor kept in MLX's cache
