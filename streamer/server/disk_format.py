"""What a --prompt-cache-dir file's header says (docs/format.md, "Prompt cache files"): the
metadata a file is written with, its entry read back from it, and the checks a loaded file's
caches pass before they are used (disk_cache.py).

Each file says the version of that metadata it was written in (FORMAT): one of a later version,
written by a later streamer sharing the folder, may mean something else by the same keys, so it is
left to that streamer rather than read as this one's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache

from ..kv_quantization import check_prompt_cache
from .disk_entries import Entry
from .disk_files import CACHE_NAME, metadata_of
from .disk_segments import foreign_arrays, held_tokens, layout

FORMAT = 1  # the version written; files written before there were versions are version 1
VERSION = "streamer_format_version"
IDENTITY = "streamer_identity"  # a chained file's model; the first format's: "streamer_model"
WHOLE_NUMBER = re.compile(r"[1-9][0-9]*")  # as str(int) writes a version: no sign, no zeros first


class LaterFormat(Exception):
    """A file of a later version than FORMAT: a later streamer's, not this one's to read or
    remove (the folder's bound still counts it)."""


def file_metadata(
    identity: str, tokens: list[int], start: int, parent: str, shape: str, trimmable: bool
) -> dict[str, str]:
    """The metadata of a file holding `tokens` after `start` (those of the file named `parent`,
    "" for none) in caches of the classes `shape`."""
    return {
        VERSION: str(FORMAT),
        IDENTITY: identity,
        "streamer_tokens": json.dumps(tokens),
        "streamer_start": str(start),
        "streamer_parent": parent,
        "streamer_layout": shape,
        "streamer_trimmable": str(trimmable),
    }


def check_version(metadata: dict) -> None:
    """LaterFormat for a file of a later version than this streamer writes; ValueError for a
    version no streamer writes. One without a version is of version 1: written before there
    were versions, in the layout of version 1 (chained, or the first format's whole files)."""
    said = metadata.get(VERSION, "1")
    if not isinstance(said, str) or not WHOLE_NUMBER.fullmatch(said):
        raise ValueError(f"its format version {said!r} is not a whole number")
    if len(said) > len(str(FORMAT)) or int(said) > FORMAT:  # int() refuses thousands of digits
        raise LaterFormat(f"format version {said}, of a later streamer: this one reads {FORMAT}")


def header_entry(path: Path, identity: str) -> Entry | None:
    """The entry of the file at `path` from its header alone, with its own tokens; None for
    another model's file; LaterFormat for a later streamer's; ValueError (KeyError,
    TypeError...) for a damaged header."""
    metadata = {k.removeprefix("0."): v for k, v in metadata_of(path).items() if k[:2] == "0."}
    check_version(metadata)
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
