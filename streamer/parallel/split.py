"""`streamer split`: one rank's share of a repacked model, for expert-parallel runs.

The shard is a repacked folder holding the resident weights and only rank r's expert records
(which ones: streamer/parallel/shards.py), so each machine of a group stores 1/N of the experts.
Records are copied byte for byte and each tensor's crc32 is checked on the way, so a shard of a
damaged folder is refused instead of spreading the damage. Output goes to `.DST.partial` and is
renamed into place when complete; a failure or Ctrl-C removes it (a split is a fast copy: no
resume).
"""

from __future__ import annotations

import os
import shutil
import sys
import zlib
from pathlib import Path

from ..errors import StreamerError
from ..io.durable import next_step, write_failure
from ..io.integrity import check_files, data_files, file_stat
from ..io.lock import lock_directory, lock_for_replacing
from ..io.manifest import (
    MANIFEST_FILE,
    RESIDENT_FILE,
    Manifest,
    MoeLayer,
    Shard,
    read_manifest,
    write_manifest,
)
from ..io.sizes import size_text
from ..repack.consume import stand_ins
from ..repack.publish import (
    check_destination,
    check_free_space,
    check_not_in_the_way,
    make_partial,
    partial_folder,
    publish,
)
from ..repack.resume_sidecar import SIDECAR_FILE
from .shards import owners


def split(
    src: str | Path,
    dst: str | Path,
    rank: int,
    ranks: int,
    *,
    trace: str | Path | None = None,
    force: bool = False,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
) -> Manifest:
    """Write rank `rank`'s shard (of `ranks`) of the repacked model `src` to `dst`."""
    src, dst = Path(src), Path(dst)
    manifest = read_manifest(src)
    if manifest.shard is not None:
        raise StreamerError(
            f"{src} is already shard {manifest.shard.rank}/{manifest.shard.ranks}: split the full "
            "repacked folder it came from."
        )
    check_files(src, manifest)
    owner = owners(manifest, ranks, Path(trace) if trace else None)
    check_destination(src, dst, force)  # never in the source; --force replaces only our output
    shard = Shard(rank, ranks, manifest.model_identity, "trace" if trace else "interleaved")
    owned = [[int(e) for e in (layer_owner == rank).nonzero()[0]] for layer_owner in owner]
    partial = partial_folder(dst)
    readers = lock_for_replacing(dst) if dst.exists() else None  # refuse while a model reads dst
    try:
        check_not_in_the_way(partial)
        check_not_a_repack(partial, dst)
        if partial.exists():
            fd = lock_directory(partial)
            shutil.rmtree(partial)
            if fd is not None:
                os.close(fd)
        make_partial(partial)
        fd = lock_directory(partial)
        try:
            check_free_space(partial, _shard_bytes(src, manifest, owned))
            result = _write(src, partial, manifest, owned, shard)
            publish(partial, dst, replace=force)
        except BaseException as e:
            shutil.rmtree(partial, ignore_errors=True)
            if isinstance(e, OSError):
                raise _io_error(e, partial) from e
            raise
        finally:
            if fd is not None:
                os.close(fd)
    finally:
        if readers is not None:
            readers.release()
    log(
        f"[split] {dst}: shard {rank}/{ranks} ({shard.assignment}), "
        f"{size_text(result.expert_file_bytes)} of {size_text(manifest.expert_file_bytes)} of "
        "experts"
    )
    return result


def check_not_a_repack(partial: Path, dst: Path) -> None:
    """An unfinished repack into the same destination is its work (with --delete-source, the only
    copy of the source shards it deleted): never removed for a split."""
    if (partial / SIDECAR_FILE).exists() or stand_ins(partial):
        raise StreamerError(
            f"{partial} is an unfinished `streamer repack` into {dst}: finish it (the same repack "
            "command with --resume), or split into another destination."
        )


def _write(
    src: Path, out: Path, manifest: Manifest, owned: list[list[int]], shard: Shard
) -> Manifest:
    for path in src.iterdir():  # config, tokenizer, generation config...
        if path.is_file() and path.name not in (MANIFEST_FILE, RESIDENT_FILE, ".lock"):
            shutil.copy2(path, out / path.name)
    shutil.copyfile(src / RESIDENT_FILE, out / RESIDENT_FILE)
    layers = tuple(
        _write_layer(src, out, index, layer, experts)
        for index, (layer, experts) in enumerate(zip(manifest.layers, owned))
    )
    files = {}
    for name in data_files(manifest):
        with open(out / name, "rb+") as f:
            os.fsync(f.fileno())
        files[name] = file_stat(out / name)
    result = Manifest(manifest.config, manifest.resident_crc32, layers, files, shard)
    write_manifest(out, result)
    return result


def _write_layer(src: Path, out: Path, index: int, layer: MoeLayer, experts: list[int]) -> MoeLayer:
    """Copy the owned records of one layer, checking each tensor's crc32 as it passes."""
    record = layer.record_bytes
    with open(src / layer.file, "rb") as source, open(out / layer.file, "wb") as target:
        for expert in experts:
            data = os.pread(source.fileno(), record, expert * record)
            for tensor, crc in zip(layer.tensors, layer.expert_crc32[expert]):
                view = memoryview(data)[tensor.offset : tensor.offset + tensor.nbytes]
                if len(data) < record or zlib.crc32(view) != crc:
                    raise StreamerError(
                        f"{src / layer.file}: MoE layer {index} ({layer.module}) expert {expert}: "
                        f"tensor {tensor.name} does not match its checksum. Run `streamer verify "
                        f"{src}`, then repack the model."
                    )
            target.write(data)
    return MoeLayer(
        layer.module,
        layer.file,
        len(experts),
        record,
        layer.quantization,
        layer.tensors,
        tuple(range(0, len(experts) * record, record)),
        tuple(layer.expert_crc32[e] for e in experts),
        tuple(experts),
    )


def _shard_bytes(src: Path, manifest: Manifest, owned: list[list[int]]) -> int:
    experts = sum(len(e) * layer.record_bytes for layer, e in zip(manifest.layers, owned))
    return (src / RESIDENT_FILE).stat().st_size + experts


def _io_error(error: OSError, partial: Path) -> StreamerError:
    why, fix = write_failure(error, partial.parent)
    return StreamerError(f"splitting failed: {why}. {next_step(fix, 'split again.')}")
