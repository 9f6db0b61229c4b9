"""A config.json transformers wrote, edited as people edit them (`architectures` left out, fields
no model reads added), still streams to what transformers computes; one with a field that mlx-lm
computes otherwise is refused with the reason."""

from __future__ import annotations

import json
import re

import pytest
from test_transformers_written import assert_streams_as

from fixtures import tiny_config
from fixtures.transformers_written import write_transformers_checkpoint
from streamer.errors import StreamerError
from streamer.families.config import check_config
from streamer.repack import repack


def test_ling_3_without_architectures_is_read_by_transformers_spelling(tmp_path):
    """mlx-lm tells Ling 3 from Ling 2.5 (both bailing_hybrid) by `architectures`; without it,
    transformers' own field names (num_experts_per_token, ...) say it is transformers' Ling 3."""
    oracle = write_transformers_checkpoint(tmp_path / "src", "bailing_hybrid")
    path = tmp_path / "src" / "config.json"
    config = json.loads(path.read_text())
    del config["architectures"]
    config.update(unknown_field=3, unknown_section={"a": [1, 2], "b": None})
    path.write_text(json.dumps(config))
    assert_streams_as(oracle, tmp_path)


def test_phimoe_routing_more_than_two_experts_is_refused_with_the_reason(tmp_path):
    """transformers' sparsemixer routes to 2 experts whatever num_experts_per_tok says (3.7 logits
    off mlx-lm's top 4 on this model; 3e-6 with the field at 2)."""
    changes = {"num_experts_per_tok": 4}
    write_transformers_checkpoint(tmp_path / "src", "phimoe", changes=changes)
    with pytest.raises(
        StreamerError, match=r"num_experts_per_tok is 4.*set num_experts_per_tok to 2"
    ):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("norm", [2.0, None])
def test_dbrx_weights_normalized_otherwise_than_by_their_sum_are_refused(norm):
    """transformers' DBRX divides the top-k weights by their norm of order
    ffn_config.moe_normalize_expert_weights (none where null); mlx-lm's by their sum, whatever it
    says. Order 1 (the published value, an integer or not) streams."""
    config = tiny_config("dbrx")
    ffn = config["ffn_config"]
    check_config({**config, "ffn_config": {**ffn, "moe_normalize_expert_weights": 1}}, "c")
    with pytest.raises(StreamerError, match=rf"moe_normalize_expert_weights is {norm}: "):
        check_config({**config, "ffn_config": {**ffn, "moe_normalize_expert_weights": norm}}, "c")


def test_qwen2_moe_renormalizing_its_top_k_is_refused():
    """transformers' Qwen2-MoE renormalizes the top-k weights where norm_topk_prob is true;
    mlx-lm's reads no such field and never does (1.9 logits apart on the tiny model). False (the
    published value) streams."""
    config = tiny_config("qwen2_moe")
    check_config({**config, "norm_topk_prob": False}, "c")
    with pytest.raises(StreamerError, match="its norm_topk_prob is true: transformers' qwen2_moe"):
        check_config({**config, "norm_topk_prob": True}, "c")


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"is_moe_layer": [False, False, True]}, "first_k_dense_replace 1 (left out)"),
        ({"first_k_dense_replace": 2}, "first_k_dense_replace 2,"),
        ({"mlp_layer_types": ["dense", "dense", "sparse"]}, "mlp_layer_types ['dense', 'dense'"),
    ],
)
def test_exaone_moe_layers_transformers_reads_otherwise_are_refused(fields, said):
    """transformers' EXAONE-MoE reads its MoE layers from mlp_layer_types, else from
    first_k_dense_replace (1 where left out), and never is_moe_layer, which is all mlx-lm's
    reads. Where they agree (the published configs), it streams."""
    config = tiny_config("exaone_moe")  # is_moe_layer [False, True, True]
    for agreeing in (
        {},
        {"first_k_dense_replace": 1},
        {"mlp_layer_types": ["dense", "sparse"] + ["sparse"]},
    ):
        check_config({**config, **agreeing}, "c")
    with pytest.raises(
        StreamerError, match=rf"its is_moe_layer \[.*are not those of its {re.escape(said)}"
    ):
        check_config({**config, **fields}, "c")
