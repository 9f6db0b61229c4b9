"""Checkpoints transformers writes with `tie_word_embeddings: true` compute what transformers'
model computes, where mlx-lm's model reads the flag otherwise
(streamer/families/tied_embeddings.py)."""

from __future__ import annotations

import json

from test_transformers_written import assert_streams_as

from fixtures.transformers_written import write_transformers_checkpoint
from streamer.io.checkpoint import Checkpoint

TIED = {"tie_word_embeddings": True}


def saved(folder) -> tuple[bool, set[str]]:
    """config.json's tie_word_embeddings and the checkpoint's tensor names."""
    with Checkpoint(folder) as ckpt:
        names = set(ckpt.tensors)
    return json.loads((folder / "config.json").read_text())["tie_word_embeddings"], names


def test_the_lm_head_transformers_leaves_out_when_tied_is_the_embeddings(tmp_path):
    """mlx-lm's DeepSeek-V3 has an lm_head of its own whatever the config says; transformers saves
    a tied one as the embeddings alone."""
    oracle = write_transformers_checkpoint(tmp_path / "src", "deepseek_v3", changes=TIED)
    tied, names = saved(tmp_path / "src")
    assert tied and "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert_streams_as(oracle, tmp_path)


def test_kimi_linear_computes_with_the_lm_head_it_saves_though_tied(tmp_path):
    """transformers' Kimi Linear never ties (it saves both, and its lm_head is what it computes
    with); mlx-lm's would tie and drop the lm_head."""
    oracle = write_transformers_checkpoint(tmp_path / "src", "kimi_linear", changes=TIED)
    tied, names = saved(tmp_path / "src")
    assert tied and "lm_head.weight" in names
    assert_streams_as(oracle, tmp_path)


def test_qwen3_vl_moe_tied_as_transformers_saves_it(tmp_path):
    """mlx-lm's Qwen3-VL-MoE sanitize reads a top-level lm_head, which transformers leaves out
    when its text model ties (and mlx-lm's tied text model has none)."""
    oracle = write_transformers_checkpoint(tmp_path / "src", "qwen3_vl_moe", changes=TIED)
    with Checkpoint(tmp_path / "src") as ckpt:
        assert not any(name.endswith("lm_head.weight") for name in ckpt.tensors)
    assert_streams_as(oracle, tmp_path)
