"""How a config field is refused: one line naming the file, the field, its value and the fix."""

from __future__ import annotations

from pathlib import Path

from ...errors import StreamerError


def bad_field(where, field: str, value: object, want: str) -> StreamerError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return StreamerError(
        f"{where}: config field {field} is {shown}, expected {want}; {remedy(where)}"
    )


def remedy(where: Path | str) -> str:
    if Path(str(where)).name == "manifest.json":
        return "the manifest was edited or damaged: repack the model."
    return "the file is damaged or belongs to another model: download config.json again."
