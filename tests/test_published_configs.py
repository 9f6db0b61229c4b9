"""Published downloads the other tests do not write: more families at their real sizes (sparse:
no disk used), and Hunyuan-A13B's per-layer lists at a tiny size."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from conftest import reference_model
from test_parity import PROMPT, assert_exactly_as

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from fixtures.published_downloads import PUBLISHED_DOWNLOADS, write_sparse_download
from streamer.families.config import check_config
from streamer.io.safetensors import read_header
from streamer.plan import plan
from streamer.repack import repack


def parameters(folder) -> int:
    """The download's parameter count from its headers (MXFP4 blocks: two to a byte; scales and
    FP8's block scales are not parameters)."""
    count = 0
    for shard in folder.glob("*.safetensors"):
        for name, info in read_header(shard).items():
            if not name.endswith(("_scales", "_scale_inv")):
                count += info.nbytes * 2 if name.endswith("_blocks") else math.prod(info.shape)
    return count


@pytest.mark.parametrize("name", sorted(PUBLISHED_DOWNLOADS))
def test_a_published_download_plans_at_its_published_size(tmp_path, name):
    """Planned from its headers exactly as repack will write it (make_recipe maps every expert
    tensor under the family's names and refuses one left over as resident): the download holds
    the published parameter count, every byte of it is counted, and the experts are most of it."""
    config, billions, fp8 = PUBLISHED_DOWNLOADS[name]
    folder = write_sparse_download(tmp_path / "download", config, fp8=fp8)
    assert abs(parameters(folder) / 1e9 / billions - 1) < 0.025
    found = plan(folder, 1 << 40)
    data = sum(
        info.nbytes for f in folder.glob("*.safetensors") for info in read_header(f).values()
    )
    assert found.download_bytes == data and found.runs
    assert 0.7 * found.disk_bytes < found.expert_bytes < found.disk_bytes


def test_hunyuan_per_layer_lists_stream_as_mlx_lm_computes_them(tmp_path):
    """Hunyuan-A13B's config.json gives moe_topk, num_shared_expert and moe_intermediate_size as
    one entry per layer ([8] * 32, [1] * 32, [3072] * 32), which mlx-lm's hunyuan reads per layer
    though its ModelArgs annotates the first two int: it was refused as 'moe_topk is [8, 8, ...],
    expected an integer; the file is damaged'. Each layer routes its own top-k here."""
    config = tiny_config(
        "hunyuan", moe_topk=[2, 3], num_shared_expert=[1, 1], moe_intermediate_size=[64, 64]
    )
    src = write_hf_checkpoint(tmp_path / "src", config)
    repack(src, tmp_path / "out", log=lambda _: None)
    model, tokenizer = streamer.load(tmp_path / "out", memory_budget=0, dtype=mx.float32)
    assert [layer.mlp.top_k for layer in model.model.layers] == [2, 3]
    assert_exactly_as(model, reference_model(src), mx.array(tokenizer.encode(PROMPT)), 8)


def test_fewer_layers_than_the_full_attention_interval_is_refused_with_the_field():
    """Qwen3-Next with fewer layers than full_attention_interval has no full attention layer:
    mlx-lm's model reads its attention mask from layer interval - 1's cache, and the first token
    was an IndexError traceback from `streamer generate`, after a repack had written it all."""
    config = tiny_config("qwen3_next", num_hidden_layers=2, mlp_only_layers=[])
    with pytest.raises(streamer.StreamerError, match="full_attention_interval is 4, expected at"):
        check_config(config, "config.json")


def test_a_llama_4_of_fewer_than_4_layers_is_refused_with_the_field():
    """mlx-lm's Llama 4 masks its global attention from the 4th layer's cache: Maverick's shapes
    at 2 layers (its published text_config cut down) were an IndexError traceback from `streamer
    plan` (its lazy pass) and would be from the first token, after a repack had written it all."""
    config = tiny_config("llama4")
    config = {**config, "text_config": {**config["text_config"], "num_hidden_layers": 2}}
    with pytest.raises(streamer.StreamerError, match="num_hidden_layers is 2, expected at least 4"):
        check_config(config, "config.json")
    check_config(tiny_config("llama4"), "config.json")  # 4 layers: its first global layer
