"""Why a checkpoint's weights may not be the model config.json describes: the fields it leaves out
where transformers' config class and mlx-lm's model args compute different values. Sizes and
counts (afmoe's num_dense_layers, ERNIE's moe_num_shared_experts, DeepSeek's
first_k_dense_replace) are not filled (defaults.py): the weights' names and shapes refuse them,
and this names the fields, where that message said only that config.json "belongs to another
model". Only fields that change a weight mlx-lm's model builds are named: the others (a RoPE base,
a list mlx-lm does not read) cannot be why the weights are refused."""

from __future__ import annotations

import dataclasses

from mlx.utils import tree_flatten

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
        model, args = mlx_lm_classes(config)
    except Exception:  # no class in either library (or one that cannot build its default)
        return ""
    try:  # its __post_init__ derives some (layer kinds from the layer count)
        ours = vars(args.from_dict(config))
    except Exception:
        ours = {f.name: _default(f) for f in dataclasses.fields(args)}
    names = [
        name
        for name in ours
        if name not in config
        and name in theirs
        and (list(ours[name]) if isinstance(ours[name], tuple) else ours[name]) != theirs[name]
    ]
    differing = [
        f"{name} (transformers: {theirs[name]!r:.40}, mlx-lm: {ours[name]!r:.40})"
        for name in _changing_weights(model, args, config, {n: theirs[n] for n in names})
    ]
    if not differing:
        return ""
    more = f" and {len(differing) - SHOWN} more" if len(differing) > SHOWN else ""
    return (
        f" config.json leaves out {', '.join(differing[:SHOWN])}{more}, which transformers and "
        "mlx-lm default differently: give them as the published config.json does."
    )


def _changing_weights(model: type, args: type, config: dict, theirs: dict) -> list[str]:
    """Of the fields in `theirs`, those whose transformers value changes a weight mlx-lm's model
    builds (its name, shape or count), each left back out of `config` with the others given as
    transformers reads them: only those can be why the weights are refused (a RoPE base or a
    layer list mlx-lm does not read cannot); one mlx-lm cannot build without is kept, and all
    where it cannot build with them. Built lazily: MLX allocates no weight."""
    built = _weight_shapes(model, args, {**config, **theirs})
    if built is None:
        return list(theirs)
    return [
        n
        for n in theirs
        if _weight_shapes(model, args, {**config, **{k: v for k, v in theirs.items() if k != n}})
        != built
    ]


def _weight_shapes(model: type, args: type, config: dict) -> dict | None:
    try:
        return {k: v.shape for k, v in tree_flatten(model(args.from_dict(config)).parameters())}
    except Exception:  # mlx-lm cannot build it (the caller decides what that means)
        return None


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
