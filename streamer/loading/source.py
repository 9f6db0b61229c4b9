"""The seam between where a model comes from and the one assembly (load.py): a repacked folder
(repacked_source.py) and an MLX download streamed in place (download_source.py) each open as a
Source, its folder locked, its description checked and mlx-lm's model built; the assembly then
does the rest in one order for both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from ..experts.parallel import ExpertShare
from ..io.expert_files import ExpertFiles
from ..io.expert_layout import LayerLayout
from ..io.lock import FolderLock
from ..io.manifest import Manifest

if TYPE_CHECKING:
    from .download_folder import Download


@dataclass(frozen=True)
class Source:
    folder: Path
    contents: Manifest | Download  # what was opened: its `layers` match `layouts`
    config: dict
    model: nn.Module  # mlx-lm's model, expert containers as the source stores its experts
    layouts: list[LayerLayout]  # where each MoE layer's experts lie
    lock: FolderLock | None  # held while the model lives (released by the handle's close)
    checksums: list | None  # [layer][expert][tensor] crc32s when verify_reads asks, else None
    shares: list[ExpertShare | None]  # expert-parallel: each layer's share of its experts
    open_files: Callable[[], ExpertFiles]  # the expert files mapped (the mapped read path)
    resident_weights: Callable[[], dict[str, mx.array]]  # checked if asked, lazily read
    mismatch: Callable[[str], str]  # resident weights the model refuses, in words
