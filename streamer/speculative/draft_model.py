"""A draft model: an ordinary mlx-lm model, small and fully resident, loaded as mlx_lm.load does."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError, one_line
from ..loading.backend import default_dtype
from ..loading.hub import resolve

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def load_draft_model(name: str | Path, tokenizer: TokenizerWrapper) -> nn.Module:
    """The model in folder `name` (or org/name in the hub cache), resident, in the compute dtype
    streamed models use here (float32 on the CPU); refused unless it shares the target's
    tokenizer: its drafts are token ids the target must read alike."""
    from mlx_lm import load

    folder = resolve(name, "draft model")
    try:
        model, draft_tokenizer = load(str(folder))
    except Exception as e:  # mlx-lm's own errors: a missing file, an unknown model type
        raise StreamerError(f"cannot load draft model {name}: {one_line(e)}") from None
    if draft_tokenizer.vocab_size != tokenizer.vocab_size:
        raise StreamerError(
            f"draft model {name} has a vocabulary of {draft_tokenizer.vocab_size} tokens and the "
            f"model {tokenizer.vocab_size}: a draft must use the model's own tokenizer."
        )
    dtype = default_dtype()
    if dtype is not None:
        model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model
