"""config.json checked before anything is built from it: at repack, and at load (the manifest's).

mlx-lm builds a model from whatever a config says: a count of 0, a string where a size belongs or a
layer count of a billion end in a foreign exception deep inside a layer, in a model with no experts,
or in minutes of building. Every field mlx-lm's ModelArgs for the model_type declares is checked
against its declared type, and the sizes and counts the engine and the model use against their
ranges, so a damaged or foreign config is refused with one line naming the field.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import StreamerError
from ...io.json_file import decode_tagged_floats, read_json_object
from ..transformers.letter_lists import letters_listed
from ..transformers.unfilled import refuse_unfilled
from .common_fields import check_common_fields, check_eos_ids
from .declared_types import check_declared_types, text_args_class
from .field_error import bad_field, remedy
from .ranges import CONTEXT_FIELDS, EXPERT_COUNTS, TOP_K, check_ranges

__all__ = [
    "check_config",
    "check_eos_ids",
    "check_layer_count",
    "check_repacked_config_json",
    "check_sizes",
    "context_field",
    "context_length",
    "experts_per_token",
    "routing_field",
]

if TYPE_CHECKING:
    from ...io.manifest import Manifest

LAYER_INDEX = re.compile(r"\blayers\.(\d+)\.")


def experts_per_token(config: dict) -> int:
    """Routed experts per token, under whichever name the family gives it (a VLM's in its
    text_config, DBRX's in its ffn_config; a per-layer list counts its largest)."""
    value = routing_field(config, TOP_K)
    if value is None:
        return 0
    return int(max(value) if isinstance(value, list) else value)


def context_length(config: dict) -> int | None:
    """The model's context (max_position_embeddings, DBRX's max_seq_len): the config's own, else
    a VLM's text_config's, where its text model reads it (None: neither gives one)."""
    field = context_field(config)
    if field is None:
        return None
    where = config["text_config"] if field.startswith("text_config.") else config
    return where[field.removeprefix("text_config.")]


def context_field(config: dict) -> str | None:
    """The field config.json gives the model's context in (text_config.max_position_embeddings
    for a VLM); None: it gives none."""
    text = config.get("text_config")
    for prefix, where in (("", config), ("text_config.", text if isinstance(text, dict) else {})):
        name = next((n for n in CONTEXT_FIELDS if where.get(n) is not None), None)
        if name is not None:
            return prefix + name
    return None


def routing_field(config: dict, names: tuple[str, ...]) -> object:
    """The first of `names` (TOP_K, EXPERT_COUNTS) the config gives, as it gives it: at its top,
    in a VLM's text_config or in DBRX's ffn_config."""
    for where in (config, config.get("text_config"), config.get("ffn_config")):
        if isinstance(where, dict):
            value = next((where[n] for n in names if where.get(n) is not None), None)
            if value is not None:
                return value
    return None


def check_config(config: object, where: Path | str) -> dict:
    """`config` if mlx-lm can build a streaming model from it; else StreamerError naming a field."""
    from ..model_types import architecture, mlx_lm_classes, mlx_lm_model_type

    _check_object(config, where)
    config = letters_listed(config)
    architecture(config, where)
    refuse_unfilled(config, where)
    check_common_fields(config, where)
    model_class, args_class = mlx_lm_classes(config, where)
    check_declared_types(config, args_class, where)
    model_config = _text_section(config, args_class)
    text_args = text_args_class(model_class)
    if text_args is not None and model_config is not config:
        check_declared_types(model_config, text_args, where, "text_config.")
    # its groups as the model file's router reads them (Ling 3's bailing_hybrid: bailing_moe_v3's)
    model_type = mlx_lm_model_type(config, where)
    model_file = model_type if model_config is config else None
    prefix = "text_config." if model_config is not config else ""
    check_ranges(model_config, where, prefix, model_file)
    if model_type == "llama4":
        _check_llama4_depth(config, where)
    return config


def _text_section(config: dict, args_class: type) -> dict:
    """The section mlx-lm builds the text model from: the text_config object where its args class
    takes one (a wrapper's, whatever it names the text args: Kimi K2.5's are DeepSeek-V3's), else
    the config itself (a stray text_config is not read)."""
    text = config.get("text_config")
    takes_text = any(f.name == "text_config" for f in dataclasses.fields(args_class))
    return text if takes_text and isinstance(text, dict) else config


def _check_llama4_depth(config: dict, where: Path | str) -> None:
    """mlx-lm's Llama 4 masks its global attention from its 4th layer's cache: fewer layers were an
    IndexError at the first token, and at plan's lazy pass."""
    text = config.get("text_config")
    layers = text.get("num_hidden_layers") if isinstance(text, dict) else None
    if type(layers) is int and layers < 4:
        want = "at least 4: the 4th layer is the model's first global attention layer"
        raise bad_field(where, "text_config.num_hidden_layers", layers, want)


def check_sizes(config: object, where: Path | str) -> dict:
    """The checks of check_config that need no mlx-lm (a JSON object with a model_type, the
    fields read outside the model classes, the ranges of the counts and sizes), for plan, which
    reads a repacked folder's config without building its model."""
    _check_object(config, where)
    check_common_fields(config, where)
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise bad_field(where, "text_config", text, "an object")
    values, prefix = (text, "text_config.") if text else (config, "")
    check_ranges(values, where, prefix)
    for group in (TOP_K, EXPERT_COUNTS):  # check_config refuses these nulls by mlx-lm's args
        given = [name for name in group if name in values]
        if given and all(values[name] is None for name in given):
            raise bad_field(where, prefix + given[0], None, "an integer")
    return config


def check_repacked_config_json(folder: Path, manifest: Manifest) -> None:
    """A repacked folder's config.json against its manifest: the model is built from the
    manifest's config (load checks the layers against that model, family by family:
    loading/manifest_layers.py), the tokenizer from config.json (transformers validates its
    types, in an error that blamed tokenizer.json), so that is checked alike, and an edit of its
    routing, which the model would not follow, is refused."""
    path = folder / "config.json"
    own = check_sizes(decode_tagged_floats(read_json_object(path, "repack the model.")), path)
    mine, built = routing_field(own, TOP_K), routing_field(manifest.config, TOP_K)
    if mine != built:  # an edit to route more or fewer experts, which no weight shows
        raise StreamerError(
            f"{path}: the routed experts per token is {mine!r} but manifest.json's config, which "
            f"the model is built from, says {built!r}: config.json was edited; set it back to "
            f"{built!r}, or repack the model to change it."
        )
    mine, built = routing_field(own, EXPERT_COUNTS), routing_field(manifest.config, EXPERT_COUNTS)
    if mine != built:  # either file may be the edited one
        raise StreamerError(
            f"{path}: it gives {mine!r} experts a layer, manifest.json's config {built!r}: one "
            "of them was edited; repack the model."
        )


def _check_object(config: object, where: Path | str) -> None:
    if not isinstance(config, dict):
        raise StreamerError(f"{where}: the model config is not a JSON object; {remedy(where)}")
    if not isinstance(config.get("model_type"), str):
        raise bad_field(
            where, "model_type", config.get("model_type"), "a string such as 'qwen3_moe'"
        )


def check_layer_count(config: dict, tensor_names, where: Path | str) -> None:
    """Refuse a layer count beyond the layers the weights hold, before building that many."""
    text = config.get("text_config")
    layers = (text if isinstance(text, dict) else config).get("num_hidden_layers")
    present = {int(m.group(1)) for name in tensor_names if (m := LAYER_INDEX.search(name))}
    if type(layers) is int and present and layers > max(present) + 1:
        raise StreamerError(
            f"{where}: num_hidden_layers is {layers} but the weights hold layers 0-{max(present)} "
            f"only; {remedy(where)}"
        )
