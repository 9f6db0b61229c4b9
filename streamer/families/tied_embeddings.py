"""`tie_word_embeddings` as transformers 5 writes checkpoints, where mlx-lm's model for the family
reads it otherwise.

transformers' `save_pretrained` leaves a tied lm_head out of the checkpoint (it is the input
embeddings). Some of mlx-lm's models have an lm_head of their own whatever config.json says
(DeepSeek-V3, GLM-4.5, gpt-oss, Llama 4, ...): for them the missing lm_head is the embeddings.
Some of transformers' models never tie (their `_tied_weights_keys` is empty) and save both:
where mlx-lm's model would tie, the saved lm_head is the one they compute with.
"""

from __future__ import annotations

from collections.abc import Iterable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

# model_types whose transformers model never ties its lm_head to the embeddings, whatever
# tie_word_embeddings says, and whose mlx-lm model ties where it says so (transformers'
# bailing_hybrid is the same: transformers/renamed_models.py reads its config as published)
NEVER_TIED = {"kimi_linear"}

LM_HEAD = "lm_head.weight"
EMBEDDINGS = "embed_tokens.weight"


def ties(config: dict) -> bool:
    """config.json ties the lm_head to the embeddings (a vision-language model: its text model)."""
    text = config.get("text_config")
    return bool(
        config.get("tie_word_embeddings")
        or (isinstance(text, dict) and text.get("tie_word_embeddings"))
    )


def untied_where_saved(config: dict, tensor_names: Iterable[str]) -> dict:
    """`config` with tie_word_embeddings false where transformers' model for it never ties and the
    checkpoint has the lm_head it saved."""
    if (
        config.get("model_type") in NEVER_TIED
        and config.get("tie_word_embeddings")
        and any(name.endswith(LM_HEAD) for name in tensor_names)
    ):
        return {**config, "tie_word_embeddings": False}
    return config


def with_tied_lm_head(model: nn.Module, config: dict, weights: dict[str, mx.array]) -> dict:
    """`weights` (sanitized, mlx-lm's names) with the lm_head that `model` has and a tied
    checkpoint leaves out: its embeddings, the one table of their shape beside it. One that a
    tied `model` has not (Qwen3-VL-MoE's sanitize keeps its top-level lm_head, filled by
    layouts.TIED_OUTPUTS) is dropped: a tied model computes with the embeddings."""
    if not ties(config):
        return weights
    expected = dict(tree_flatten(model.parameters()))
    weights = {n: a for n, a in weights.items() if n in expected or not n.endswith(LM_HEAD)}
    for head, arr in expected.items():
        if not head.endswith(LM_HEAD) or head in weights:
            continue
        prefix = head.removesuffix(LM_HEAD)  # a vision-language model's "language_model."
        tables = [
            name
            for name in weights
            if name.startswith(prefix)
            and name.endswith(EMBEDDINGS)
            and tuple(weights[name].shape) == tuple(arr.shape)
            and name.removesuffix("weight") + "scales" not in weights
        ]
        if len(tables) == 1:
            weights = {**weights, head: weights[tables[0]]}
    return weights
