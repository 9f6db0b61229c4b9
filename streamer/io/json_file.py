"""Untrusted JSON (config.json, the checkpoint's index, safetensors headers, the manifest, the
resume sidecar, launch's hostfile): every defect becomes one StreamerError naming the file and
what to do."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import StreamerError
from .files import read_bytes


def parse_json_object(raw: bytes | str, where: str, fix: str, unique_keys: bool = False) -> dict:
    """`raw` (UTF-8) as a JSON object; `where` names it in errors, `fix` says what to do.
    `unique_keys` refuses a key given twice in an object (json keeps the last one silently; the
    safetensors reader of Hugging Face refuses such a header)."""
    data = parse_json(raw, where, fix, unique_keys)
    if not isinstance(data, dict):
        raise StreamerError(f"{where} is not a JSON object; {fix}")
    return data


def parse_json(raw: bytes | str, where: str, fix: str, unique_keys: bool = False) -> object:
    """`raw` (UTF-8) as JSON of any shape (a hostfile may be a list), as parse_json_object."""
    hook = _no_duplicates if unique_keys else None
    try:
        data = json.loads(
            raw.decode("utf-8") if isinstance(raw, bytes) else raw, object_pairs_hook=hook
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StreamerError(f"{where} is not valid JSON ({e}); {fix}") from e
    except ValueError as e:  # Python's own limit, whose message advises a setting in Python
        raise StreamerError(f"{where} holds an integer of over 4300 digits; {fix}") from e
    except _DuplicateKey as e:
        raise StreamerError(f"{where} names {e} twice; {fix}") from None
    except RecursionError:
        raise StreamerError(f"{where} is nested too deeply to be read; {fix}") from None
    return data


def read_json_object(path: Path, fix: str, missing: str | None = None) -> dict:
    """The JSON object in file `path`; `missing` says what to do if there is no such file."""
    try:
        raw = read_bytes(path, "a JSON file")
    except FileNotFoundError:
        raise StreamerError(f"{path} is missing: {missing or fix}") from None
    except OSError as e:
        raise StreamerError(f"cannot read {path}: {e.strerror or e}; {fix}") from e
    return parse_json_object(raw, str(path), fix)


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _DuplicateKey(repr(next(k for k in keys if keys.count(k) > 1)))
    return dict(pairs)


# transformers 5 writes a non-finite float as {"__float__": "Infinity"} so that config.json stays
# JSON (Nemotron-H's time_step_limit); mlx-lm reads it back as the float.
_FLOAT_TAG = "__float__"
_TAGGED = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def decode_tagged_floats(value: object) -> object:
    """`value` with each tagged non-finite float as the float."""
    if isinstance(value, dict):
        if set(value) == {_FLOAT_TAG} and value[_FLOAT_TAG] in _TAGGED:
            return _TAGGED[value[_FLOAT_TAG]]
        return {k: decode_tagged_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_tagged_floats(v) for v in value]
    return value


def encode_tagged_floats(value: object) -> object:
    """`value` with each non-finite float tagged again, for a config.json that stays JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return {
            _FLOAT_TAG: "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        }
    if isinstance(value, dict):
        return {k: encode_tagged_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_tagged_floats(v) for v in value]
    return value
