"""Resumable repacking: a sidecar in the `.DST.partial` folder records the work already finished.

The repacker records the resident file and each MoE layer only after that file is fsynced, so
whatever the sidecar lists is complete on disk, whenever the process was killed. `--resume`
continues an interrupted repack only if the source checkpoint and options are the ones it started
with (a hash of config.json, the tensor table and the options), and keeps every recorded layer.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import StreamerError
from ..io.checkpoint import Checkpoint
from ..io.json_file import read_json_object
from ..io.manifest import (
    FORMAT_VERSION,
    RESIDENT_FILE,
    MoeLayer,
    layer_from_json,
    layer_to_json,
    write_json_atomic,
)

PROGRESS_FILE = "progress.json"


def source_identity(ckpt: Checkpoint, options: dict) -> str:
    """A hash of what determines the repacked bytes: config.json, the tensor table, the options."""
    digest = hashlib.sha256()
    digest.update((ckpt.folder / "config.json").read_bytes())
    table = sorted(
        (
            name,
            info.path.name,
            info.dtype,
            list(info.shape),
            info.start,
            info.end,
            info.path.stat().st_size,
        )
        for name, info in ckpt.tensors.items()
    )
    digest.update(json.dumps([FORMAT_VERSION, options, table]).encode())
    return digest.hexdigest()


class Progress:
    """What an (interrupted) repack into `folder` has finished: the resident file and MoE layers."""

    def __init__(self, folder: Path, identity: str):
        self.folder = Path(folder)
        self.identity = identity
        self.resident: dict[str, int] | None = None  # crc32 per resident tensor, once written
        self.layers: dict[int, MoeLayer] = {}

    @classmethod
    def load(cls, folder: Path, identity: str) -> Progress | None:
        """The recorded progress (None if there is none); refuses one from another source or
        options."""
        path = Path(folder) / PROGRESS_FILE
        if not path.exists():
            return None
        state = read_json_object(path, "rerun without --resume to start over.")
        if state.get("source") != identity:
            raise StreamerError(
                f"{folder} was started from a different checkpoint or with other options "
                "(config.json, the tensors or --quantize differ): rerun without --resume to start "
                "over."
            )
        progress = cls(folder, identity)
        progress.resident = state.get("resident")
        for index, entry in state.get("layers", {}).items():
            layer = layer_from_json(entry, path)
            if progress._complete(layer.file, layer.file_bytes):
                progress.layers[int(index)] = layer
        if progress.resident is not None and not (Path(folder) / RESIDENT_FILE).exists():
            progress.resident = None
        return progress

    def _complete(self, file: str, size: int) -> bool:
        path = self.folder / file
        return path.exists() and path.stat().st_size == size

    @property
    def started(self) -> bool:
        return self.resident is not None

    def record_resident(self, crc32: dict[str, int]) -> None:
        self.resident = crc32
        self._save()

    def record_layer(self, index: int, layer: MoeLayer) -> None:
        self.layers[index] = layer
        self._save()

    def _save(self) -> None:
        state = {
            "source": self.identity,
            "resident": self.resident,
            "layers": {str(i): layer_to_json(layer) for i, layer in sorted(self.layers.items())},
        }
        write_json_atomic(self.folder / PROGRESS_FILE, state)

    def remove(self) -> None:
        (self.folder / PROGRESS_FILE).unlink(missing_ok=True)
