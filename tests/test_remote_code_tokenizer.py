"""A tokenizer that ships its own Python code (as Kimi K2's does) runs only when the user says
so; one of a model type transformers does not know loads without transformers' config."""

from __future__ import annotations

import json
import shutil

import pytest

import streamer
from fixtures.published_shapes import PUBLISHED_SHAPES
from streamer.loading.options import load_options

TOKENIZER_CODE = '''
import os

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast


class ShippedTokenizer(PreTrainedTokenizerFast):
    """Stands for a tokenizer that only its own code can read (Kimi K2's reads a tiktoken file)."""

    vocab_files_names = {"vocab_file": "shipped_vocab.json"}

    def __init__(self, vocab_file=None, **kwargs):
        super().__init__(tokenizer_object=Tokenizer.from_file(vocab_file), **kwargs)
'''


def test_tokenizer_with_shipped_code_needs_trust_remote_code(checkpoints, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(checkpoints.hf("qwen3_moe"), src)
    (src / "shipped_tokenizer.py").write_text(TOKENIZER_CODE)
    (src / "tokenizer.json").rename(src / "shipped_vocab.json")
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "ShippedTokenizer"
    config["auto_map"] = {"AutoTokenizer": [None, "shipped_tokenizer.ShippedTokenizer"]}
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    streamer.repack.repack(src, tmp_path / "dst", log=lambda _: None)
    assert (
        tmp_path / "dst" / "shipped_tokenizer.py"
    ).exists()  # carried over with the tokenizer files

    with pytest.raises(
        streamer.StreamerError,
        match="tokenizer is Python code shipped with the model.*--trust-remote-code",
    ):
        streamer.load(tmp_path / "dst", memory_budget=0)
    model, tokenizer = streamer.load(tmp_path / "dst", memory_budget=0, trust_remote_code=True)
    assert type(tokenizer._tokenizer).__name__ == "ShippedTokenizer"
    assert streamer.generate(model, tokenizer, "The value", max_tokens=4)
    # mlx_lm.load's way to say it, decided with the keyword in one place: the tokenizer_config's
    # False overrode trust_remote_code=True, whose refusal then said to pass trust_remote_code=True
    said = {"trust_remote_code": True}
    assert load_options(tokenizer_config=said) == load_options(trust_remote_code=True)
    with pytest.raises(streamer.StreamerError, match="trust_remote_code=True and tokenizer_config"):
        streamer.load(
            tmp_path / "dst", trust_remote_code=True, tokenizer_config={"trust_remote_code": False}
        )


def test_a_model_type_transformers_does_not_know_with_rope_scaling(checkpoints, tmp_path):
    """Kimi K2's kimi_k2 with its published rope_scaling: transformers 5 failed building a
    config for it inside AutoTokenizer ("'PreTrainedConfig' object has no attribute
    'max_position_embeddings'", mlx-lm too). The tokenizer is the one mlx-lm builds without the
    field."""
    import mlx_lm.utils

    from streamer.loading.tokenizer import load_tokenizer

    src = tmp_path / "kimi"
    shutil.copytree(checkpoints.hf("kimi_k2"), src)
    plain = mlx_lm.utils.load_tokenizer(src)
    config = json.loads((src / "config.json").read_text())
    config["rope_scaling"] = PUBLISHED_SHAPES["kimi-k2"]["rope_scaling"]  # yarn, factor 32
    (src / "config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(src, trust_remote_code=False)
    assert type(tokenizer._tokenizer) is type(plain._tokenizer)
    assert tokenizer._tokenizer.init_kwargs == plain._tokenizer.init_kwargs
    assert tokenizer.encode("def main(): pass") == plain.encode("def main(): pass")
