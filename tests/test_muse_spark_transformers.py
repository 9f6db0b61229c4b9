"""Muse Spark as transformers 5 writes it (MuseSparkForConditionalGeneration, `save_pretrained`:
its names, its config.json with a vision and an audio config) streams: the vision tower stays
resident as mlx-lm keeps it, and the streamed model computes what mlx-lm's resident model does
(with conftest's stand-ins for mlx-lm's Metal kernels where Metal is absent). transformers' own
logits are no written here: mlx-lm's model with those stand-ins differs from them (README's row
for muse_spark says by how much)."""

from __future__ import annotations

import copy

import mlx.core as mx
import torch
from conftest import reference_model
from test_parity import compare
from transformers import AutoConfig, AutoModelForImageTextToText

import streamer
from fixtures import tiny_config
from fixtures.tokenizer import write_tokenizer
from fixtures.transformers_written import _init
from streamer.repack import repack

VISION = dict(
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    pos_emb_height=4,
    pos_emb_width=4,
    patch_size=2,
)


def test_muse_spark_written_by_transformers_streams_as_mlx_lm_computes(tmp_path):
    published = tiny_config("muse_spark")
    text = {k: v for k, v in published["text_config"].items() if k != "model_type"}
    config = AutoConfig.for_model(
        "muse_spark",
        text_config=text,
        vision_config=VISION,
        audio_config=published["audio_config"],
        out_hidden_size=4 * VISION["hidden_size"],  # the vision tower's, merged 2 x 2
        projector_hidden_size=64,
    )
    written = AutoModelForImageTextToText.from_config(config).eval()
    _init(written, seed=0)
    saved = copy.deepcopy(written)
    for param in saved.parameters():
        param.data = param.data.to(torch.bfloat16)
    saved.save_pretrained(tmp_path / "src")
    write_tokenizer(tmp_path / "src")
    repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)
    reference = reference_model(tmp_path / "src")
    compare(tmp_path / "dst", reference, tolerance=0.0)
    model, _ = streamer.load(tmp_path / "dst", memory_budget=0, dtype=mx.float32)
    assert model.model.vision_tower is not None  # resident, as mlx-lm keeps it
