"""A draft model: an ordinary mlx-lm model, small and fully resident, loaded as mlx_lm.load does."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError, one_line
from ..loading.backend import refuse_gather_mm
from ..loading.hub import resolve

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def load_draft_model(
    name: str | Path, tokenizer: TokenizerWrapper, dtype: mx.Dtype | None
) -> nn.Module:
    """The model in folder `name` (or org/name in the hub cache), resident, in `dtype`: the
    streamed model's load's (Streaming.load_dtype; None: each tensor's own, a GPU's default).
    Refused unless it shares the target's tokenizer (its drafts are token ids the target must
    read alike), and where this backend cannot compute its experts in `dtype`, as the streamed
    model is (loading/backend.py)."""
    from mlx_lm import load

    folder = resolve(name, "draft model")
    try:
        model, draft_tokenizer = load(str(folder))
    except Exception as e:  # mlx-lm's own errors: a missing file, an unknown model type
        raise StreamerError(f"cannot load draft model {name}: {one_line(e)}") from None
    differs = vocabulary_difference(draft_tokenizer, tokenizer)
    if differs:
        raise StreamerError(
            f"draft model {name} {differs}: a draft must use the model's own tokenizer (its "
            "drafts are token ids the model reads)."
        )
    if dtype is not None:
        _check_computes(model, dtype, name)
        model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def _check_computes(model: nn.Module, dtype: mx.Dtype, name: str | Path) -> None:
    """Refuse now, not at the first draft, unquantized experts (mlx-lm's SwitchLinear, computed
    by gather_mm) in a dtype this backend's gather_mm lacks (the CPU's runs only in float32)."""
    from mlx_lm.models.switch_layers import SwitchLinear

    if not any(isinstance(m, SwitchLinear) for _, m in model.named_modules()):
        return
    refuse_gather_mm(dtype, f"draft model {name}'s", lambda: "a quantized draft model")


def vocabulary_difference(draft: TokenizerWrapper, target: TokenizerWrapper) -> str | None:
    """How the draft's vocabulary (token -> id, added tokens too) differs from the target's, in
    words; None if it is the same. Sizes alone let a tokenizer with other ids through."""
    ours, theirs = draft.get_vocab(), target.get_vocab()
    if len(ours) != len(theirs):
        return f"has a vocabulary of {len(ours)} tokens and the model {len(theirs)}"
    for token, id_ in sorted(ours.items(), key=lambda item: item[1]):
        if theirs.get(token) != id_:
            where = "is not in the model's" if token not in theirs else f"is {theirs[token]}"
            return f"has token {token!r} as id {id_}, which in the model's vocabulary {where}"
    return None
