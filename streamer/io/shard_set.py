"""Whether a checkpoint folder's shards are the set its download wrote: a numbered set with no
member missing, and an index whose every tensor its shard holds."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import StreamerError
from .safetensors import read_header

INDEX_FILE = "model.safetensors.index.json"
NUMBERED_SHARD = re.compile(r"model-(\d+)-of-(\d+)\.safetensors")  # Hugging Face's shard names


def check_numbered_shards(folder: Path, names: set[str]) -> None:
    """Without an index, `model-0000K-of-0000N.safetensors` (K from 1) says N shards belong
    together: refuse a folder lacking one of them (else the missing layers were blamed on
    config.json). Numbers that do not run 1..N are some other scheme, not checked."""
    numbered = [(m, name) for name in sorted(names) if (m := NUMBERED_SHARD.fullmatch(name))]
    if any(not 1 <= int(m[1]) <= int(m[2]) for m, _ in numbered):
        return
    sets: dict[tuple[int, str], str] = {}  # (digits, N) -> its first shard, to name
    for match, name in numbered:
        sets.setdefault((len(match[1]), match[2]), name)
    for (width, total), name in sets.items():  # each set once, not once a shard
        for k in range(1, min(int(total), 100_000) + 1):
            missing = f"model-{k:0{width}d}-of-{total}.safetensors"
            if missing not in names:
                raise StreamerError(
                    f"{folder} holds {name} but not {missing}: the download is incomplete; "
                    "fetch that file."
                )


def misplaced_tensor(folder: Path, name: str, shard: str, read: set[Path]) -> StreamerError:
    """The index places tensor `name` in `shard`, which lacks it. A shard the index does not name
    (not among the `read` ones) holding it says the index is another download's: mlx-lm, which
    reads every model*.safetensors, loads such a folder; otherwise the shard is incomplete."""
    placed = f"{folder / INDEX_FILE} places tensor '{name}' in {shard}"
    for path in sorted(set(folder.glob("model*.safetensors")) - read):
        try:
            holds = name in read_header(path)
        except StreamerError:  # a damaged file the index leaves out says nothing of the index
            continue
        if holds:
            return StreamerError(
                f"{placed}, but {path.name} holds it, a shard the index does not name: the index "
                f"belongs to another download; download it again, or delete {INDEX_FILE} to "
                "read every model*.safetensors in the folder."
            )
    return StreamerError(
        f"{placed}, which does not contain it: the shard is incomplete; download it again."
    )
