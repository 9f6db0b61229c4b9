"""How a config field is refused: one line naming the file, the field, its value and the fix."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import StreamerError


def bad_field(where, field: str, value: object, want: str) -> StreamerError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return StreamerError(
        f"{where}: config field {field} is {shown}, expected {want}; {remedy(where)}"
    )


def remedy(where: Path | str) -> str:
    path = Path(str(where))
    if path.name == "manifest.json":
        return "the manifest was edited or damaged: repack the model."
    if os.path.exists(path.parent / "manifest.json"):  # a repacked folder's copy of the config
        return "the repacked folder's config.json was edited or damaged: repack the model."
    return "the file is damaged or belongs to another model: download config.json again."
