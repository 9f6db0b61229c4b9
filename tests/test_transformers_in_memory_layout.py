"""A checkpoint transformers 5 saves in its in-memory layout (`save_original_format=False`) is
refused with what to do, not as an incomplete download."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from fixtures.tokenizer import write_tokenizer
from fixtures.transformers_families import COMMON
from streamer.errors import StreamerError
from streamer.repack import repack


def test_transformers_in_memory_experts_are_refused_with_the_save_to_use(tmp_path):
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **COMMON))
    model.save_pretrained(tmp_path / "src", save_original_format=False)
    write_tokenizer(tmp_path / "src")
    with pytest.raises(
        StreamerError,
        match=r"'model\.layers\.0\.mlp\.experts\.(gate_up|down)_proj'.*"
        r"save_original_format=True",
    ):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()
