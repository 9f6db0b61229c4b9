"""Every crc32 of a repacked folder recomputed: `streamer verify`, the --resume check of what a
repack already wrote, and `load(verify_reads=True)` (an expert's tensors as it
is read)."""

from __future__ import annotations

import mmap
import os
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import StreamerError
from .files import open_regular
from .integrity import file_size
from .manifest import RESIDENT_FILE, Manifest, MoeLayer
from .safetensors import read_header
from .sizes import rate_text


def mismatched_tensors(
    names: Sequence[str], crcs: Sequence[int], tensors: Sequence[memoryview | np.ndarray]
) -> list[str]:
    """Names of an expert's tensors (`tensors`, their bytes) whose crc32 differs from the one
    recorded: the one check behind `streamer verify` and `load(verify_reads=True)`."""
    return [name for name, data, crc in zip(names, tensors, crcs) if zlib.crc32(data) != crc]


@dataclass(frozen=True)
class Problem:
    """One thing `verify` found wrong: the file and, when known, the tensor (and expert)."""

    file: str
    what: str

    def __str__(self) -> str:
        return f"{self.file}: {self.what}"


def verify_resident(folder: Path, manifest: Manifest) -> list[Problem]:
    """crc32 of every non-expert tensor against the manifest."""
    path = Path(folder) / RESIDENT_FILE
    try:
        header = read_header(path)
    except StreamerError as e:
        return [Problem(RESIDENT_FILE, str(e))]
    problems = [
        Problem(RESIDENT_FILE, f"tensor '{n}' is missing")
        for n in manifest.resident_crc32
        if n not in header
    ]
    problems += [
        Problem(RESIDENT_FILE, f"tensor '{n}' is not in the manifest")
        for n in header
        if n not in manifest.resident_crc32
    ]
    try:
        with _mapped(path) as data:
            for name, info in header.items():
                expected = manifest.resident_crc32.get(name)
                if expected is not None and zlib.crc32(data[info.start : info.end]) != expected:
                    problems.append(
                        Problem(RESIDENT_FILE, f"tensor '{name}' does not match its checksum")
                    )
    except (OSError, StreamerError) as e:
        problems.append(Problem(RESIDENT_FILE, f"cannot read: {getattr(e, 'strerror', None) or e}"))
    return problems


def verify_layer(
    folder: Path, index: int, layer: MoeLayer, advance: Callable[[int], None] = lambda _: None
) -> list[Problem]:
    """crc32 of every tensor of every expert of one MoE layer; a short file fails the experts it
    cuts. `advance(n)` is told of each expert's `n` bytes once checked (a progress bar)."""
    layer_name = f"MoE layer {index} ({layer.module})"
    try:
        with _mapped(Path(folder) / layer.file) as data:
            problems = []
            if len(data) != layer.file_bytes:
                problems.append(
                    Problem(
                        layer.file,
                        f"holds {len(data)} bytes, the manifest expects {layer.file_bytes}",
                    )
                )
            for expert, bad in _bad_expert_tensors(data, layer, advance):
                why = (
                    "lies past the end of the file"
                    if bad is None
                    else f"tensor {bad} does not match its checksum"
                )
                problems.append(Problem(layer.file, f"{layer_name} expert {expert}: {why}"))
            return problems
    except StreamerError as e:  # not a regular file
        return [Problem(layer.file, f"{layer_name}: {e}")]
    except OSError as e:
        return [Problem(layer.file, f"{layer_name}: cannot read: {e.strerror or e}")]


def _bad_expert_tensors(
    data: memoryview, layer: MoeLayer, advance: Callable[[int], None]
) -> Iterator[tuple[int, str | None]]:
    """(expert, tensor name) for each mismatching tensor; (expert, None) for a record cut off by
    the end of the file."""
    for expert, base in enumerate(layer.expert_offsets):
        if base + layer.record_bytes > len(data):
            yield expert, None
        else:
            tensors = [data[base + t.offset : base + t.offset + t.nbytes] for t in layer.tensors]
            names = [t.name for t in layer.tensors]
            for name in mismatched_tensors(names, layer.expert_crc32[expert], tensors):
                yield expert, name
        advance(layer.record_bytes)


class _mapped:
    """A read-only memoryview of a whole file (empty for an empty file), closed on exit."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> memoryview:
        with os.fdopen(open_regular(self.path, "a data file of the repacked model"), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.view = memoryview(self.map) if self.map is not None else memoryview(b"")
        return self.view

    def __exit__(self, *exc) -> None:
        self.view.release()
        if self.map is not None:
            self.map.close()


def folder_bytes(folder: Path, manifest: Manifest) -> int:
    """The bytes verify_folder reads: the resident file and every expert file."""
    try:
        resident_bytes = file_size(Path(folder) / RESIDENT_FILE, "the non-expert weights")
    except StreamerError:
        resident_bytes = 0  # missing or unreadable: verify_resident reports it as a problem
    return manifest.expert_file_bytes + resident_bytes


def verify_folder(
    folder: Path,
    manifest: Manifest,
    log: Callable[[str], None],
    advance: Callable[[int], None] = lambda _: None,
) -> list[Problem]:
    """Every checksum of a repacked folder, with one progress line per file and `advance(n)` for
    each n bytes checked; the problems found."""
    folder = Path(folder)
    start = time.perf_counter()
    total = folder_bytes(folder, manifest)
    problems = verify_resident(folder, manifest)
    done = total - manifest.expert_file_bytes
    advance(done)
    log(f"[verify] {RESIDENT_FILE}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    for index, layer in enumerate(manifest.layers):
        found = verify_layer(folder, index, layer, advance)
        problems += found
        done += layer.file_bytes
        rate = rate_text(done, time.perf_counter() - start)
        status = "ok" if not found else f"{len(found)} problem(s)"
        log(
            f"[verify] layer {index + 1}/{len(manifest.layers)} {layer.file}: {status} "
            f"({done / total:.0%}, {rate})"
        )
    return problems
