"""Sizes as people read them, one convention for every message: binary units (as sizes are typed:
--memory-budget 8G is 8 GiB), in the largest unit the size reaches, so never "0.00 GB"."""

from __future__ import annotations

UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def size_text(n: float) -> str:
    """`n` bytes: "1.50 GiB", "3.25 MiB", "12.00 KiB", "512 B"."""
    for unit, scale in UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def rate_text(n: float, seconds: float) -> str:
    """`n` bytes in `seconds` as a rate in the same units: "412.35 MiB/s"."""
    return f"{size_text(n / max(seconds, 1e-9))}/s"
