"""Sizes as people type and read them, one convention for every option and message: binary units
(--memory-budget 8G is 8 GiB), written in the largest unit the size reaches, so never "0.00 GB"."""

from __future__ import annotations

import math
import numbers
import re

from ..errors import ArgumentError

UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_TYPED = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_TYPED_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: object, name: str) -> int:
    """Bytes from an integer or a size typed as 8G, 8GB, 8GiB, 8 GB or 512M, for every size option
    and keyword alike. Each is memory or disk, so text with no unit that is a fraction ("0.5": 0
    bytes) or from 1 to below 1 MiB ("16": 16 GiB meant) is refused; 0 needs none; an int is
    bytes."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, str)):
        raise ArgumentError(  # numpy's integers are taken
            f"{name} must be a number of bytes or a size such as '8G' (got {value!r})."
        )
    if isinstance(value, str):
        match = _TYPED.match(value)
        number = float(match.group(1)) * _TYPED_UNITS[match.group(2).lower()] if match else math.nan
        if match and match.group(3).lower() == "i":  # "8Gi" without the B
            number = math.nan
        if match and not match.group(2) and _unit_left_out(number):
            typed = value.strip()
            raise ArgumentError(
                f"{name} {value!r} has no unit, so it counts bytes: write {typed}G for {typed} GiB."
            )
    else:
        number = int(value)
    if not math.isfinite(number) or number < 0:
        raise ArgumentError(f"{name} {value!r} is not a size such as 8G, 8GB, 8 GiB or 512M.")
    return int(number)


def _unit_left_out(number: float) -> bool:
    """A size typed without its unit that cannot mean bytes: a fraction, or under 1 MiB."""
    return math.isfinite(number) and (number != int(number) or 0 < number < 1 << 20)


def size_text(n: float) -> str:
    """`n` bytes: "1.50 GiB", "3.25 MiB", "12.00 KiB", "512 B"."""
    for unit, scale in UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def rate_text(n: float, seconds: float) -> str:
    """`n` bytes in `seconds` as a rate in the same units: "412.35 MiB/s"."""
    return f"{size_text(n / max(seconds, 1e-9))}/s"
