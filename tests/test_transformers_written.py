"""Checkpoints written by transformers itself (its model classes, `save_pretrained`) stream, and
the streamed model computes what transformers' own model computes: float32 logits within 1e-4 and
64 identical greedy tokens. The oracle is transformers, not mlx-lm: this is the check for layouts
mlx-lm cannot read (gpt-oss as transformers writes it unquantized) and for the config.json
spellings transformers 5 writes.

The only module that imports torch (fixtures/transformers_written.py): a few seconds, once.
"""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest
import torch
from test_parity import PROMPT, greedy_tokens
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

import streamer
from fixtures.tokenizer import write_tokenizer
from fixtures.transformers_families import COMMON, FAMILIES
from fixtures.transformers_vision_families import VISION_LANGUAGE
from fixtures.transformers_written import families, write_transformers_checkpoint
from streamer.errors import StreamerError
from streamer.families.config import check_config
from streamer.io.checkpoint import Checkpoint
from streamer.repack import repack


def transformers_greedy(model, prompt: list[int], n: int = 64) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("model_type", families())
def test_streams_what_transformers_computes(tmp_path, model_type):
    assert_streams_as(write_transformers_checkpoint(tmp_path / "src", model_type), tmp_path)


def assert_streams_as(oracle, tmp_path) -> None:
    """The checkpoint in tmp_path/src, repacked and streamed, computes what `oracle` computes."""
    repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)
    model, tokenizer = streamer.load(tmp_path / "dst", memory_budget=0, dtype=mx.float32)
    prompt = tokenizer.encode(PROMPT)
    ours = np.array(model(mx.array(prompt)[None]))
    with torch.no_grad():
        theirs = oracle(torch.tensor([prompt])).logits.numpy()
    diff = np.abs(ours - theirs).max()
    assert diff <= 1e-4, f"max abs logit difference {diff}"
    assert greedy_tokens(model, mx.array(prompt)) == transformers_greedy(oracle, prompt)


def test_gpt_oss_is_written_in_the_unquantized_transformers_layout(tmp_path):
    """What the test above streams for gpt-oss is the layout of the BF16 re-uploads, which
    mlx-lm's sanitize does not read (streamer/repack/layouts.py converts it)."""
    write_transformers_checkpoint(tmp_path, "gpt_oss")
    with Checkpoint(tmp_path) as ckpt:
        experts = {
            name.rsplit(".", 1)[1]: info.shape
            for name, info in ckpt.tensors.items()
            if name.startswith("model.layers.0.mlp.experts.")
        }
    hidden, inter = 64, 32
    assert experts == {
        "gate_up_proj": (8, hidden, 2 * inter),
        "gate_up_proj_bias": (8, 2 * inter),
        "down_proj": (8, inter, hidden),
        "down_proj_bias": (8, hidden),
    }


def test_ling_3_layers_mlx_lm_places_otherwise_are_refused(tmp_path):
    """transformers' Ling 3 makes the layers after the last whole group KDA, mlx-lm's
    bailing_moe_v3 MLA: such a config, as transformers writes it, is refused with the reason."""
    write_transformers_checkpoint(tmp_path / "src", "bailing_hybrid")
    fields = {**COMMON, **FAMILIES["bailing_hybrid"], "num_hidden_layers": 3}
    config = AutoConfig.for_model("bailing_hybrid", **fields)
    config.architectures = ["BailingHybridForCausalLM"]  # as its model's save_pretrained writes
    config.save_pretrained(tmp_path / "src")
    with pytest.raises(StreamerError, match=r"computes it otherwise.*layer_types \['linear_atten"):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)


def test_kimi_k25_without_q_lora_as_transformers_saves_it_is_refused(tmp_path):
    """transformers 5.24 saves a Kimi K2.5 text model without q LoRA with its q_proj under the
    vision tower's fused name, rows permuted by the vision heads (which transformers cannot load
    back either): refused, naming the tensor."""
    text, vision, top = VISION_LANGUAGE["kimi_k25"]
    text = {**COMMON, **text, "q_lora_rank": None}
    config = AutoConfig.for_model("kimi_k25", text_config=text, vision_config=vision, **top)
    AutoModelForImageTextToText.from_config(config).save_pretrained(tmp_path / "src")
    write_tokenizer(tmp_path / "src")
    with pytest.raises(
        StreamerError, match=r"'language_model\.model\.blocks\.0\.self_wqkv\.weight'"
    ):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)


def test_hunyuan_v1_moe_is_refused_with_how_mlx_lm_computes_it_otherwise(tmp_path):
    """transformers' Hunyuan MoE is Hunyuan-A13B, mlx-lm's hunyuan, but weighted otherwise."""
    fields = {**COMMON, "tie_word_embeddings": True}  # as Hunyuan-A13B publishes
    config = AutoConfig.for_model("hunyuan_v1_moe", **fields)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "src")
    write_tokenizer(tmp_path / "src")
    with pytest.raises(StreamerError, match="hunyuan_v1_moe.*renormalized to sum to 1"):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (dict(mlp_layer_types=["sparse", "dense"]), "mlp_layer_types"),
        (dict(moe_renormalize=False), "moe_renormalize is false"),
        (dict(attention_bias=True), "attention_bias is true"),
        (dict(kda_safe_gate=False), "kda_safe_gate is false"),
        (dict(hidden_act="gelu"), "hidden_act is 'gelu'"),
    ],
)
def test_ling_3_configs_mlx_lm_computes_otherwise_are_refused(fields, reason):
    """The Ling 3 configs transformers computes with that mlx-lm's bailing_moe_v3 does not."""
    config = AutoConfig.for_model("bailing_hybrid", **{**COMMON, **FAMILIES["bailing_hybrid"]})
    config.architectures = ["BailingHybridForCausalLM"]
    for name, value in fields.items():
        setattr(config, name, value)
    with pytest.raises(StreamerError, match=f"computes it otherwise.*{re.escape(reason)}"):
        check_config(config.to_dict(), "config.json")
