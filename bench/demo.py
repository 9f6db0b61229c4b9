"""The model a benchmark runs when it is given none: the demo model shipped in streamer/,
repacked into a temporary folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_model_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", help="a repacked folder (default: the demo model, repacked)")


def model_or_demo(model: str | None, tmp: Path) -> str:
    """`model` (a repacked folder) or, when None, the demo model repacked under `tmp`."""
    if model is not None:
        return model
    from streamer.cli import DEMO_MODEL
    from streamer.repack import repack

    folder = Path(tmp) / "demo"
    repack(DEMO_MODEL, folder, log=lambda _: None)
    return str(folder)
