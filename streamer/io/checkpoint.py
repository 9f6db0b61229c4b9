"""A downloaded checkpoint folder: config.json plus safetensors shards (with or without an
index)."""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx

from ..errors import StreamerError
from .file_watch import identity
from .files import check_folder_files, check_utf8_path, gguf_refusal, open_regular
from .json_file import read_json_object
from .manifest import MANIFEST_FILE
from .safetensors import TensorInfo, read_header
from .shard_set import INDEX_FILE, check_numbered_shards, misplaced_tensor

# NVIDIA ModelOpt's exports may keep their quantization beside config.json rather than in it
QUANTIZATION_SIDECAR = "hf_quant_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def has_tokenizer_files(folder: Path) -> bool:
    """Without any of these, transformers builds an empty tokenizer from config.json alone."""
    folder = Path(folder)
    return any((folder / n).is_file() for n in TOKENIZER_FILES) or any(folder.glob("*.tiktoken"))


def _is_file_name(name: object) -> bool:
    """A shard name the index may give: a plain file name, no path into or out of other folders."""
    return isinstance(name, str) and bool(name) and "\0" not in name and Path(name).name == name


def _shard_names(weight_map: dict, index_path: Path) -> set[str]:
    """The shards an index's weight_map names, each name checked once (Kimi K2's names 140k
    tensors: a check per tensor took about a second of `streamer plan`)."""
    values = weight_map.values()
    names = {v for v in values if isinstance(v, str)}
    bad = [v for v in values if not isinstance(v, str)] or [
        n for n in sorted(names) if not _is_file_name(n)
    ]
    if bad:
        raise StreamerError(
            f"{index_path}: weight_map names shard {bad[0]!r}, not a file in this folder; "
            "download the index again."
        )
    return names


def _identity(path: Path) -> tuple[int, ...]:
    """file_watch's identity of the file at `path` (none for one gone)."""
    try:
        return identity(os.stat(path))
    except OSError:
        return ()


class Checkpoint:
    """Tensor table of a checkpoint folder. Reads bytes with pread; never loads a whole shard.

    `stand_ins` names, for shards a `repack --delete-source` has already deleted, a file holding
    that shard's header at its original size (the data a hole): the table stays whole, so an
    interrupted repack can resume, and reading such a shard's data is refused.
    """

    def __init__(self, folder: Path | str, stand_ins: dict[str, Path] | None = None):
        self.folder = Path(folder)
        self.stand_ins = dict(stand_ins or {})
        gguf = gguf_refusal(self.folder)
        if gguf:
            raise StreamerError(gguf)
        if not self.folder.is_dir():
            raise StreamerError(
                f"{self.folder} is not a folder: give the folder of a downloaded checkpoint."
            )
        check_utf8_path(self.folder, "the checkpoint folder")
        check_folder_files(self.folder, "a file of the checkpoint")
        self.config = read_json_object(
            self.folder / "config.json",
            "download it again.",
            missing="point at the folder that holds the model's config.json and *.safetensors "
            "files.",
        )
        # each shard as its header was read, and a quantization sidecar as read
        self._stats: dict[Path, tuple[int, ...]] = {}
        sidecar = self.folder / QUANTIZATION_SIDECAR
        text = self.config.get("text_config")
        placed = "quantization_config" in self.config or (
            isinstance(text, dict) and "quantization_config" in text
        )
        if not placed and sidecar.exists():  # read as mlx-lm's loader reads it
            self._stats[sidecar] = _identity(sidecar)
            self.config["quantization_config"] = read_json_object(sidecar, "download it again.")
        self.tensors = self._tensor_table()
        self._fds: dict[Path, int] = {}
        self._lazy_shards: dict[Path, dict[str, mx.array]] = {}

    def _shards(self) -> list[Path]:
        index_path = self.folder / INDEX_FILE
        if index_path.exists():
            weight_map = read_json_object(index_path, "download it again.").get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise StreamerError(f"{index_path} has no weight_map; download it again.")
            shards = sorted(self._shard(name) for name in _shard_names(weight_map, index_path))
            for shard in shards:
                if (
                    not shard.exists() and not shard.is_symlink()
                ):  # a broken link is reported when read
                    raise StreamerError(
                        f"{index_path} names shard {shard.name}, which is missing from "
                        f"{self.folder}: the download is incomplete; fetch that file."
                    )
            self._weight_map = weight_map
            return shards
        self._weight_map = None
        shards = sorted(self.folder.glob("model*.safetensors"))
        shards += [
            path for name, path in self.stand_ins.items() if self.folder / name not in shards
        ]
        if not shards and (self.folder / MANIFEST_FILE).exists():  # a repack's output
            raise StreamerError(
                f"{self.folder} is repacked already (it holds {MANIFEST_FILE}): it streams as it "
                f"is, with --model {self.folder}; repack takes a checkpoint as downloaded."
            )
        if not shards:
            raise StreamerError(
                f"{self.folder} holds no model*.safetensors files: nothing to repack."
            )
        check_numbered_shards(self.folder, {path.name for path in shards})
        return shards

    def _shard(self, name: str) -> Path:
        path = self.folder / name
        if name in self.stand_ins and not path.exists():
            return self.stand_ins[name]
        return path

    def _tensor_table(self) -> dict[str, TensorInfo]:
        table: dict[str, TensorInfo] = {}
        for shard in self._shards():
            header = read_header(shard)
            self._stats[shard] = _identity(shard)
            for name, info in header.items():
                if name in table:
                    raise StreamerError(
                        f"tensor '{name}' appears in both {table[name].path.name} and {shard.name}."
                    )
                table[name] = info
        if self._weight_map is not None:
            for name, shard_name in self._weight_map.items():
                if name not in table:
                    raise misplaced_tensor(self.folder, name, shard_name, set(self._stats))
        return table

    def file_stamps(self) -> dict[str, list[int] | None]:
        """The size and modification time (ns) of each file read for the tensors and their
        quantization, by name, as it was read: what a resume checks (a new revision of a file may
        keep its size). None for a stand-in: its shard's data is all written, and its own time is
        not the shard's."""
        return {
            path.name: None if path.name in self.stand_ins else list(was[2:])
            for path, was in self._stats.items()
        }

    def lazy(self, name: str) -> mx.array:
        """A lazily loaded tensor (mx.load reads no data until evaluated)."""
        path = self.tensors[name].path
        if path not in self._lazy_shards:
            self._lazy_shards[path] = mx.load(str(path))
        return self._lazy_shards[path][name]

    def forget_lazy(self) -> None:
        """Let go of the lazily loaded shards: a tensor evaluated from them is then freed once its
        last other holder lets go (a later `lazy` loads its shard again)."""
        self._lazy_shards.clear()

    def read(self, info: TensorInfo, start: int = 0, length: int | None = None) -> bytes:
        """`length` bytes of a tensor from byte `start` within it (whole tensor by default)."""
        length = info.nbytes - start if length is None else length
        if info.path.name in self.stand_ins:
            raise StreamerError(
                f"{self.folder / info.path.name} was deleted by `repack --delete-source` before "
                f"tensor '{info.name}' was written: the repack cannot finish; download it again."
            )
        fd = self._fds.get(info.path)
        if fd is None:
            fd = self._fds[info.path] = open_regular(info.path, "a shard of the checkpoint")
        data = os.pread(fd, length, info.start + start)
        if len(data) != length:
            raise StreamerError(
                f"{info.path}: short read in tensor '{info.name}'; the file changed or is "
                "truncated."
            )
        return data

    def check_unchanged(self) -> None:
        """Refuse a shard (or quantization sidecar) replaced, written to or cut short since it was
        read (a download fetching it again): its bytes read before and after would be mixed."""
        for shard, was in self._stats.items():
            if shard.name not in self.stand_ins and _identity(shard) != was:
                raise StreamerError(
                    f"{shard} changed while repacking (another program wrote it: a download?): "
                    "let that finish, then repack again."
                )

    def release(self, path: Path) -> None:
        """Close what is open on one shard (its descriptor and lazily loaded tensors), so that
        deleting it frees its space."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)
        self._lazy_shards.pop(path, None)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
