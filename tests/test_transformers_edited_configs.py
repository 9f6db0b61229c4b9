"""A config.json transformers wrote, edited as people edit them (`architectures` left out, fields
no model reads added), still streams to what transformers computes."""

from __future__ import annotations

import json

from test_transformers_written import assert_streams_as

from fixtures.transformers_written import write_transformers_checkpoint


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
