"""Broken files for the tests: hand-made safetensors bytes, a checkpoint tensor rewritten, a byte
flipped (bit rot), a manifest edited, special files where a regular one belongs, and the check
that a refusal never hangs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from streamer.errors import StreamerError
from streamer.io.safetensors import read_header, to_mlx, write_safetensors


def safetensors_file(
    folder: Path, header: bytes | dict | list, data: bytes = b"", length: int | None = None
) -> Path:
    """folder/model.safetensors: an 8-byte header length (`length`, else the header's own), the
    header (a dict or list as JSON, or raw bytes), then `data`."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = folder / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def flip_byte(path: Path, offset: int, keep_time: bool = True) -> None:
    """Bit rot: one byte changes, the file's size and (with keep_time) its time do not."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    if keep_time:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def edited_copy(folder: Path, dst: Path, change: Callable[[dict], object]) -> Path:
    """A copy of repacked `folder` at `dst` whose manifest.json `change` has edited in place."""
    shutil.copytree(folder, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    change(manifest)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def rewrite_tensor(src, name: str, change) -> None:
    """Replace tensor `name` in its shard by change(tensor), keeping everything else."""
    index = json.loads((src / "model.safetensors.index.json").read_text())
    shard = src / index["weight_map"][name]
    header = read_header(shard)
    data = shard.read_bytes()
    tensors = [(n, to_mlx(data[i.start : i.end], i.dtype, i.shape)) for n, i in header.items()]
    write_safetensors(shard, [(n, change(t) if n == name else t) for n, t in tensors])


class _Hang(Exception):
    pass


def make_special(path: Path, kind: str) -> None:
    """Replace `path` by a FIFO, a directory or a listening-less Unix socket."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        # bound under a short name, then moved (tmp_path lies in the same temp folder): a
        # socket's path is at most 107 bytes, and pytest-xdist's worker folders lengthen tmp_path
        with tempfile.TemporaryDirectory() as short:
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(os.path.join(short, "s"))
            sock.close()
            os.rename(os.path.join(short, "s"), path)


def refused_without_hanging(call: Callable[[], object], *patterns: str) -> None:
    """`call()` raises a StreamerError naming each of `patterns` within 20 s (never blocks)."""

    def hang(*_):
        raise _Hang("blocked on a special file")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(20)
    try:
        with pytest.raises(StreamerError) as err:
            call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    for pattern in patterns:
        assert pattern in str(err.value), str(err.value)
