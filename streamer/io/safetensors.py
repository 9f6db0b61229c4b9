"""Safetensors headers, read with validation, and a writer that streams one tensor at a time.

The safetensors library needs every tensor in memory to save and has no numpy bf16 type, so the
engine parses headers itself: it needs byte ranges (to copy an expert's rows without reading the
whole stacked tensor) and it must reject hostile headers with a message naming the file.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import StreamerError
from .files import open_regular
from .json_file import parse_json_object

# safetensors dtype -> (numpy storage dtype, mlx dtype). bf16 is stored as uint16 in numpy.
DTYPES: dict[str, tuple[np.dtype, mx.Dtype]] = {
    "F64": (np.dtype("<f8"), mx.float64),
    "F32": (np.dtype("<f4"), mx.float32),
    "F16": (np.dtype("<f2"), mx.float16),
    "BF16": (np.dtype("<u2"), mx.bfloat16),
    "I64": (np.dtype("<i8"), mx.int64),
    "I32": (np.dtype("<i4"), mx.int32),
    "I16": (np.dtype("<i2"), mx.int16),
    "I8": (np.dtype("i1"), mx.int8),
    "U64": (np.dtype("<u8"), mx.uint64),
    "U32": (np.dtype("<u4"), mx.uint32),
    "U16": (np.dtype("<u2"), mx.uint16),
    "U8": (np.dtype("u1"), mx.uint8),
    "BOOL": (np.dtype("?"), mx.bool_),
    "F8_E4M3": (np.dtype("u1"), mx.uint8),  # mlx has no fp8 dtype: bytes, decoded by mx.from_fp8
    # power-of-two scales (DeepSeek-V4.1's UE8M0): the exponent byte, as mlx reads it
    "F8_E8M0": (np.dtype("u1"), mx.uint8),
}
MLX_TO_SAFETENSORS = {
    mlx: name for name, (_, mlx) in DTYPES.items() if name not in ("F8_E4M3", "F8_E8M0")
}
# dtypes the safetensors format defines that MLX cannot load (not corruption: refused as such).
# F64 is in DTYPES as mx.float64 exists (write_safetensors writes one), but mx.load refuses it and
# no MLX model computes in it
UNLOADABLE_DTYPES = ("F64", "F8_E5M2", "F4", "F6_E2M3", "F6_E3M2", "C64")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
LFS_POINTER_PREFIX = b"version https://git-lfs"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes live: `start`/`end` are absolute offsets in `path`."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def itemsize(dtype: str) -> int:
    return DTYPES[dtype][0].itemsize


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and validate a safetensors header; raise StreamerError naming the file on any
    defect."""
    path = Path(path)
    try:
        with os.fdopen(open_regular(path, "a safetensors file"), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(len(LFS_POINTER_PREFIX))
            if head.startswith(LFS_POINTER_PREFIX):
                raise StreamerError(
                    f"{path} is a git-LFS pointer file, not weights: run `git lfs pull` in "
                    "that folder (or download the file again) before repacking."
                )
            if len(head) < 8:
                raise StreamerError(
                    f"{path} is truncated: {size} bytes, too short for a safetensors file."
                )
            head = head[:8]
            f.seek(8)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise StreamerError(
                    f"{path}: header length {n} is impossible for a {size}-byte file; the file is "
                    "truncated or not safetensors. Download it again."
                )
            raw = f.read(n)
    except OSError as e:
        link = f" (a symbolic link to {os.readlink(path)})" if path.is_symlink() else ""
        raise StreamerError(
            f"cannot read {path}{link}: {e.strerror or e}. Fix or download that file again."
        ) from e
    header = parse_json_object(raw, f"{path}: header", "the file is corrupt.", unique_keys=True)
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise StreamerError(
            f"{path}: __metadata__ must map names to strings (as the safetensors format "
            "requires); the file is corrupt or was written by a faulty tool."
        )
    data_start = 8 + n
    data_size = size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_info(path, name, entry, data_start, data_size)
    _check_no_overlap(path, tensors.values())
    return tensors


def _tensor_info(
    path: Path, name: str, entry: object, data_start: int, data_size: int
) -> TensorInfo:
    def bad(why: str) -> StreamerError:
        return StreamerError(f"{path}: tensor '{name}': {why}; the file is corrupt or truncated.")

    if not isinstance(entry, dict):
        raise bad("header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype in UNLOADABLE_DTYPES:
        raise StreamerError(
            f"{path}: tensor '{name}' is {dtype}, which MLX cannot load: convert the checkpoint "
            "to bf16, fp16 or fp32 first."
        )
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise bad(f"unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise bad(f"invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise bad(f"invalid data_offsets {offsets!r}")
    if offsets[1] > data_size:
        raise bad(f"data ends at byte {offsets[1]} but the file holds only {data_size} data bytes")
    expected = math.prod(shape) * itemsize(dtype)
    if offsets[1] - offsets[0] != expected:
        raise bad(
            f"{offsets[1] - offsets[0]} bytes for shape {shape} of {dtype} (expected {expected})"
        )
    return TensorInfo(
        name, path, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1]
    )


def _check_no_overlap(path: Path, tensors: Iterable[TensorInfo]) -> None:
    ordered = sorted((t for t in tensors if t.nbytes), key=lambda t: t.start)
    for a, b in zip(ordered, ordered[1:]):
        if b.start < a.end:
            raise StreamerError(
                f"{path}: tensors '{a.name}' and '{b.name}' overlap; the file is corrupt."
            )


# Exponent bits of each float format: a value with all of them set is Inf or NaN.
_EXPONENT_MASKS = {"BF16": 0x7F80, "F16": 0x7C00, "F32": 0x7F800000}


def nonfinite_count(data: bytes | memoryview | np.ndarray, dtype: str) -> int:
    """How many NaN/Inf values the raw bytes of a `dtype` tensor hold (0 for integer dtypes).

    Works on the bit patterns, so bf16 needs no conversion and the cost is one pass over the bytes.
    """
    mask = _EXPONENT_MASKS.get(dtype)
    if mask is None:
        return 0
    bits = np.frombuffer(data, dtype=np.dtype(f"<u{itemsize(dtype)}"))
    return int(np.count_nonzero((bits & mask) == mask))


def to_mlx(raw: np.ndarray | memoryview | bytes, dtype: str, shape: tuple[int, ...]) -> mx.array:
    """Bytes of one tensor -> an mx.array (copies once)."""
    storage, mlx_dtype = DTYPES[dtype]
    arr = mx.array(np.frombuffer(raw, dtype=storage).reshape(shape))
    return arr.view(mlx_dtype) if arr.dtype != mlx_dtype else arr


def write_safetensors(
    path: Path,
    tensors: list[tuple[str, mx.array]],
    metadata: dict[str, str] | None = None,
    dtypes: dict[str, str] | None = None,
    written: Callable[[int], object] = lambda _: None,
    release: bool = False,
) -> dict[str, int]:
    """Write tensors one at a time (each evaluated just before it is written); return crc32 per
    name. `written` is told each tensor's bytes once they are written (a progress bar).

    The header is computed from lazy shapes and dtypes, so peak memory is one tensor, not the file,
    where the caller holds them lazy; `release` empties `tensors` as they are written, so that
    tensors nothing else holds are freed once written. `dtypes` names the safetensors dtype of
    tensors mlx cannot type itself (F8_E4M3 held as uint8).
    """
    header: dict[str, object] = {"__metadata__": metadata or {"format": "mlx"}}
    offset = 0
    for name, arr in tensors:
        if arr.dtype not in MLX_TO_SAFETENSORS:
            raise StreamerError(f"cannot write tensor '{name}' of dtype {arr.dtype} to {path}")
        header[name] = {
            "dtype": (dtypes or {}).get(name, MLX_TO_SAFETENSORS[arr.dtype]),
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep tensor data 8-byte aligned, as the format recommends
    checksums = {}
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for index in range(len(tensors)):
            name, arr = tensors[index]
            if release:
                tensors[index] = (name, None)
            mx.eval(arr)
            data = memoryview(mx.contiguous(arr)).cast("B")
            checksums[name] = zlib.crc32(data)
            f.write(data)
            written(len(data))
            del arr, data
            if release:
                mx.clear_cache()  # else MLX keeps the freed buffer for arrays of its size
        if release:
            tensors.clear()
        f.flush()
        os.fsync(f.fileno())
    return checksums
