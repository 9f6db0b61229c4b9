"""A data file whose modification time moved since repacking: a copy, or an edit?

`cp -r`, most file managers and many sync tools do not keep file times, so a model moved to an
external SSD has new times on every file. A new time alone is therefore only a hint: the file is
then sampled, and loads if the sample matches the crc32s in the manifest. The sample is every
small tensor (at most SAMPLE_TENSOR_BYTES) of a few experts spread over the file, the first and
last included, or of the resident file: an edit or a different model in place of the file is
caught there, as is a copy cut short or filled with zeros past some point. A change in bytes
outside the sample is caught by `streamer verify` and by `--verify-reads`, which check every
crc32; `streamer verify --refresh` records the new times so later loads skip the sample.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from .files import open_regular
from .manifest import RESIDENT_FILE, Manifest, MoeLayer
from .safetensors import read_header

SAMPLED_EXPERTS = 4
SAMPLE_TENSOR_BYTES = 64 * 1024
SAMPLED_RESIDENT_TENSORS = 32


def sample_matches(folder: Path, manifest: Manifest, name: str) -> bool:
    """True if the sampled tensors of data file `name` (relative) match the manifest's crc32s."""
    path = Path(folder) / name
    if name == RESIDENT_FILE:
        ranges = _resident_sample(path, manifest)
    else:
        layer = next((layer for layer in manifest.layers if layer.file == name), None)
        if layer is None:
            return True  # a file the manifest records but no layer reads
        ranges = _expert_sample(layer)
    fd = open_regular(path, "a data file of the repacked model")
    try:
        return all(zlib.crc32(os.pread(fd, n, start)) == crc for start, n, crc in ranges)
    finally:
        os.close(fd)


def _expert_sample(layer: MoeLayer) -> list[tuple[int, int, int]]:
    """(offset, nbytes, crc32) of the small tensors of the sampled experts."""
    count = min(SAMPLED_EXPERTS, layer.num_experts)
    experts = sorted({round(i * (layer.num_experts - 1) / max(count - 1, 1)) for i in range(count)})
    small = [i for i, t in enumerate(layer.tensors) if t.nbytes <= SAMPLE_TENSOR_BYTES]
    if not small:  # every tensor is large: the smallest one
        small = [min(range(len(layer.tensors)), key=lambda i: layer.tensors[i].nbytes)]
    return [
        (
            layer.expert_offsets[e] + layer.tensors[i].offset,
            layer.tensors[i].nbytes,
            layer.expert_crc32[e][i],
        )
        for e in experts
        for i in small
    ]


def _resident_sample(path: Path, manifest: Manifest) -> list[tuple[int, int, int]]:
    """The small resident tensors, spread over the file, and the file's last tensor."""
    header = sorted(read_header(path).values(), key=lambda info: info.start)
    small = [info for info in header if info.nbytes <= SAMPLE_TENSOR_BYTES]
    step = max(len(small) // SAMPLED_RESIDENT_TENSORS, 1)
    chosen = {info.name: info for info in small[::step]}
    if header and header[-1].nbytes <= 16 * SAMPLE_TENSOR_BYTES:
        chosen[header[-1].name] = header[-1]
    return [
        (info.start, info.nbytes, manifest.resident_crc32.get(info.name, -1))
        for info in chosen.values()
    ]
