"""Muse Spark as transformers 5 writes it (MuseSparkForConditionalGeneration, `save_pretrained`:
its names, its config.json with a vision and an audio config) streams: the vision tower stays
resident as mlx-lm keeps it, and the streamed model computes what mlx-lm's resident model does
(through conftest's stand-ins for mlx-lm's Metal kernels where Metal is absent).

Against transformers' own float32 forward, mlx-lm's model differs by its three deliberate bf16
roundings (the first layer's attention input, the final norm's output, the norm gains 1 + w):
with those three undone in mlx-lm's model file, the streamed model computes what transformers
computes, which also checks the kernel stand-ins against transformers' reference code."""

from __future__ import annotations

import copy
import inspect

import mlx.core as mx
import numpy as np
import pytest
import torch
from conftest import reference_model
from metal_stand_ins import KERNELS
from mlx_lm.models import muse_spark
from test_parity import PROMPT, compare, greedy_tokens
from test_transformers_written import transformers_greedy
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
# mlx-lm's bf16 roundings that transformers' float32 forward does not make
BF16_ROUNDINGS = (
    ("self.input_layernorm(x).astype(mx.bfloat16)", "self.input_layernorm(x)"),
    ("return self.norm(h).astype(mx.bfloat16)", "return self.norm(h)"),
    ("(1.0 + weight.astype(mx.float32)).astype(mx.bfloat16)", "(1.0 + weight.astype(mx.float32))"),
)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(folder, transformers' model in float32 on the saved bf16 values)."""
    folder = tmp_path_factory.mktemp("muse_spark_transformers") / "src"
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
    model = AutoModelForImageTextToText.from_config(config).eval()
    _init(model, seed=0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16))
    saved = copy.deepcopy(model)
    for param in saved.parameters():
        param.data = param.data.to(torch.bfloat16)
    saved.save_pretrained(folder)
    write_tokenizer(folder)
    return folder, model.float()


def test_written_by_transformers_streams_as_mlx_lm_computes(written, tmp_path):
    src, _ = written
    repack(src, tmp_path / "dst", log=lambda _: None)
    compare(tmp_path / "dst", reference_model(src), tolerance=0.0)
    model, _ = streamer.load(tmp_path / "dst", memory_budget=0, dtype=mx.float32)
    assert model.model.vision_tower is not None  # resident, as mlx-lm keeps it


def test_without_mlx_lm_s_bf16_roundings_it_computes_what_transformers_computes(
    written, tmp_path, monkeypatch
):
    source = inspect.getsource(muse_spark)
    for rounded, exact in BF16_ROUNDINGS:
        assert source.count(rounded) == 1, rounded  # mlx-lm's file as this test knows it
        source = source.replace(rounded, exact)
    unrounded = dict(vars(muse_spark))
    exec(compile(source, muse_spark.__file__, "exec"), unrounded)
    unrounded.update(KERNELS if not mx.metal.is_available() else {})
    for name, value in unrounded.items():
        if inspect.isclass(value) or inspect.isfunction(value):
            monkeypatch.setattr(muse_spark, name, value)
    src, oracle = written
    repack(src, tmp_path / "dst", log=lambda _: None)
    model, tokenizer = streamer.load(tmp_path / "dst", memory_budget=0, dtype=mx.float32)
    prompt = tokenizer.encode(PROMPT)
    with torch.no_grad():
        theirs = oracle(input_ids=torch.tensor([prompt])).logits.numpy()
    diff = np.abs(np.array(model(mx.array(prompt)[None])) - theirs).max()
    assert diff <= 1e-4, f"max abs logit difference {diff}"
    assert greedy_tokens(model, mx.array(prompt)) == transformers_greedy(oracle, prompt)
