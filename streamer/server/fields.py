"""Request bodies and their fields, checked: every bad value is an `ApiError` (4xx).

The body must be a JSON object of valid UTF-8 text (no lone surrogates, which tokenizers refuse);
each field is read with `checked`, which checks its type and range and names it in the error.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from http import HTTPStatus
from typing import Any

from ..errors import StreamerError

log = logging.getLogger("streamer.server")

MAX_BODY_BYTES = 32 << 20
MAX_INT = (1 << 31) - 1  # counts (tokens, top_k): what MLX's int32 indices can hold
# Arrays and objects within one another: a request needs a few levels (a tool's JSON schema
# some more). The body is copied, rendered and serialized recursively after json.loads, which
# takes ~1000: 900 levels in a message's extra key ran out of stack there (a 500).
MAX_DEPTH = 64


class ApiError(Exception):
    """An error answered as OpenAI does: `{"error": {message, type, param, code}}`."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code=None, headers=None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers: dict[str, str] = headers or {}  # what the answer's head says too (Allow)

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


def server_failure(summary: str, error: Exception) -> ApiError:
    """A 500 for what failed on the server's side: the answer says `summary` and a reference, the
    log has the detail under it (an OSError's message names the server's files)."""
    reference = uuid.uuid4().hex[:8]
    trace = None if isinstance(error, StreamerError) else error  # streamer's own say it in a line
    log.error("%s [reference %s]: %s", summary, reference, error, exc_info=trace)
    return ApiError(500, f"{summary}; its detail is logged under reference {reference}")


def http_refusal(handler, code: int, message: str | None = None, explain: str | None = None):
    """http.server's own refusals (a request line or headers it cannot parse or that are too long,
    a method no handler takes) as OpenAI-style errors, where it wrote an HTML page."""
    handler._error(ApiError(code, message or HTTPStatus(code).phrase))


def parse_body(raw: bytes) -> dict:
    try:
        # a byte order mark, which JSON parsers may skip (RFC 8259): Windows tools write one
        text = raw.decode("utf-8-sig")
        body = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_once_each)
        json.dumps(body, ensure_ascii=False).encode("utf-8")  # a "\ud800" escape is not text
    except UnicodeError:
        raise ApiError(400, "the request body is not UTF-8 text") from None
    except ValueError as e:  # Python's advice on an integer of thousands of digits is the server's
        said = "a number has too many digits" if "integer string conversion" in str(e) else e
        raise ApiError(400, f"the request body is not valid JSON: {said}") from None
    except RecursionError:
        raise ApiError(400, "the request body nests arrays or objects too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if depth(body) > MAX_DEPTH:
        raise ApiError(400, f"the request body nests arrays or objects over {MAX_DEPTH} deep")
    return body


def depth(value: Any) -> int:
    """How many arrays and objects deep `value` nests (without recursing: it may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                children = value.values() if isinstance(value, dict) else value
                stack.extend((child, depth + 1) for child in children)
    return deepest


def _once_each(pairs: list[tuple[str, Any]]) -> dict:
    """An object whose keys are distinct: json.loads keeps a repeated key's last value, where a
    proxy or gateway in front (checking max_tokens, say) may have read its first."""
    found: dict = {}
    for key, value in pairs:
        if key in found:
            raise ApiError(400, f"the request body repeats the key {key[:80]!r} in one object")
        found[key] = value
    return found


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked(
    body: dict,
    name: str,
    kind: type,
    *,
    required: bool = False,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    where: str | None = None,
):
    """body[name] checked for type and range; None when absent (or JSON null). Integers are
    bounded by MAX_INT unless `high` says otherwise."""
    param = f"{where}.{name}" if where else name
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"{param} is required", param=param)
        return None
    ok = {
        int: is_int(value),
        float: (is_int(value) or isinstance(value, float)) and _finite(value),
        bool: isinstance(value, bool),
    }.get(kind, isinstance(value, kind))
    if not ok:
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        what = names.get(kind, "an array" if kind is list else "an object")
        raise ApiError(400, f"{param} must be {what}", param=param)
    if kind is int and high is None:
        high = MAX_INT
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        bounds = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
        raise ApiError(400, f"{param} must lie in {bounds} (got {value})", param=param)
    return float(value) if kind is float else value


def check_ids_below(ids, field: str, vocabulary: int) -> None:
    """ApiError 400 for a token id (a prompt's, logit_bias's keys) at or past `vocabulary`: the
    embedding, or mlx-lm's logit_bias, would be indexed out of bounds."""
    past = next((t for t in ids if t >= vocabulary), None)
    if past is not None:
        raise ApiError(
            400,
            f"{field}: token id {past} is past the model's vocabulary ({vocabulary} tokens): "
            f"token ids must be below {vocabulary}",
            param=field,
        )
