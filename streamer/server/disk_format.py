"""What a --prompt-cache-dir file's header says (docs/format.md, "Prompt cache files"): the
metadata a file is written with, its entry read back from it, and the checks a loaded file's
caches pass before they are used (disk_cache.py)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache

from ..kv_quantization import check_prompt_cache
from .disk_entries import Entry
from .disk_files import CACHE_NAME, metadata_of
from .disk_segments import foreign_arrays, held_tokens, layout

IDENTITY = "streamer_identity"  # a chained file's model; the first format's: "streamer_model"


def file_metadata(
    identity: str, tokens: list[int], start: int, parent: str, shape: str, trimmable: bool
) -> dict[str, str]:
    """The metadata of a file holding `tokens` after `start` (those of the file named `parent`,
    "" for none) in caches of the classes `shape`."""
    return {
        IDENTITY: identity,
        "streamer_tokens": json.dumps(tokens),
        "streamer_start": str(start),
        "streamer_parent": parent,
        "streamer_layout": shape,
        "streamer_trimmable": str(trimmable),
    }


def header_entry(path: Path, identity: str) -> Entry | None:
    """The entry of the file at `path` from its header alone, with its own tokens; None for
    another model's file; ValueError (KeyError, TypeError...) for a damaged header."""
    metadata = {k.removeprefix("0."): v for k, v in metadata_of(path).items() if k[:2] == "0."}
    if identity_of(metadata) != identity:
        return None
    tokens = json.loads(metadata["streamer_tokens"])
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise ValueError("its tokens are not a list of ids")
    trimmable = metadata.get("streamer_trimmable") == "True"
    if IDENTITY not in metadata:  # the first format: a whole cache, continued by none
        return Entry(path, tuple(tokens), trimmable)
    name = metadata["streamer_parent"]
    if name and not CACHE_NAME.fullmatch(name):
        raise ValueError(f"it continues {name!r}, not a file of its folder")
    parent = path.with_name(name) if name else None
    start = int(metadata["streamer_start"])
    return Entry(path, tuple(tokens), trimmable, start, parent, metadata["streamer_layout"])


def identity_of(metadata: dict) -> str | None:
    """The model a file's cache is of (the first format's whole files name it otherwise)."""
    return metadata.get(IDENTITY, metadata.get("streamer_model"))


def check_loaded(
    cache: list, metadata: dict, entry: Entry, identity: str, model: nn.Module | None
) -> None:
    """ValueError (ArgumentError naming the layer, for `model`'s) unless the cache and metadata
    loaded from `entry`'s file are what its header said when listed, and hold what a prompt of
    `model` makes."""
    said = identity_of(metadata), json.loads(metadata.get("streamer_tokens", "null"))
    if said != (identity, list(entry.own)):
        raise ValueError("its metadata changed since it was listed")
    if entry.layout is not None and layout(cache) != entry.layout:
        raise ValueError(f"it holds caches {layout(cache)}, not {entry.layout}")
    if entry.trimmable and not can_trim_prompt_cache(cache):  # mlx-lm would cut nothing
        raise ValueError("its header says it can be cut back, and its caches cannot")
    if not held_tokens(cache, len(entry.own), entry.end):
        raise ValueError(f"it does not hold its {len(entry.own)} tokens")
    if (foreign := foreign_arrays(cache)) is not None:
        raise ValueError(foreign)
    if model is not None:
        check_prompt_cache(model, cache)
