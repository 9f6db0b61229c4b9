"""Published config.json forms the tiny fixtures do not write: Hunyuan-A13B's per-layer lists."""

from __future__ import annotations

import mlx.core as mx
from conftest import reference_model
from test_parity import PROMPT, assert_exactly_as

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.repack import repack


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
