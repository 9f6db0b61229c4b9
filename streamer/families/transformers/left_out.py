"""Why a checkpoint's weights may not be the model config.json describes: the fields it leaves out
where transformers' config class and mlx-lm's model args compute different values. Sizes and
counts (afmoe's num_dense_layers, ERNIE's moe_num_shared_experts, DeepSeek's
first_k_dense_replace) are not filled (defaults.py): the weights' names and shapes refuse them,
and this names the fields, where that message said only that config.json "belongs to another
model"."""

from __future__ import annotations

import dataclasses

from ..model_types import mlx_lm_classes
from .spellings import normalize_config

SHOWN = 4  # fields named at most: a config leaving out more is not the model's own


def left_out_hint(config: dict) -> str:
    """' config.json leaves out F (transformers: a, mlx-lm: b), ...: give them as the published
    config.json does.' for the fields `config` leaves out (and streamer does not fill) that the
    two libraries compute differently from it; '' for none, or where either has no class."""
    try:
        config = normalize_config(config)  # what is filled is not left out
        theirs = _transformers_values(config)
        args = mlx_lm_classes(config)[1]
    except Exception:  # no class in either library (or one that cannot build its default)
        return ""
    try:  # its __post_init__ derives some (layer kinds from the layer count)
        ours = vars(args.from_dict(config))
    except Exception:
        ours = {f.name: _default(f) for f in dataclasses.fields(args)}
    differing = [
        f"{name} (transformers: {theirs[name]!r:.40}, mlx-lm: {ours[name]!r:.40})"
        for name in ours
        if name not in config
        and name in theirs
        and (list(ours[name]) if isinstance(ours[name], tuple) else ours[name]) != theirs[name]
    ]
    if not differing:
        return ""
    more = f" and {len(differing) - SHOWN} more" if len(differing) > SHOWN else ""
    return (
        f" config.json leaves out {', '.join(differing[:SHOWN])}{more}, which transformers and "
        "mlx-lm default differently: give them as the published config.json does."
    )


def _transformers_values(config: dict) -> dict:
    """transformers' config class's values for `config` (its defaults where it refuses it)."""
    from transformers import CONFIG_MAPPING

    kind = CONFIG_MAPPING[config["model_type"]]
    try:
        return kind.from_dict(config).to_dict()
    except Exception:
        return kind().to_dict()


def _default(field: dataclasses.Field) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return "none, it is required"
