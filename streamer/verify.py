"""`streamer verify`: recompute every checksum of a repacked folder or of a download streamed in
place (against its sidecar, streamer/io/checksums.py) and name each bad tensor."""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from .errors import StreamerError, refusal
from .io.checkpoint import Checkpoint
from .io.checksums import (
    Checksums,
    default_sidecar,
    file_sha256,
    hub_blob_sha256,
    read_checksums,
    write_checksums,
)
from .io.integrity import data_files, file_stat, stat_change
from .io.lock import lock_for_replacing
from .io.manifest import MANIFEST_FILE, read_manifest, write_manifest
from .io.sizes import rate_text
from .io.tensor_crcs import Problem, folder_bytes, verify_folder
from .progress import above, progress_bar


def verify(
    folder: str | Path,
    *,
    refresh: bool = False,
    record: bool = False,
    checksums: str | Path | None = None,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
) -> list[Problem]:
    """Every problem found in `folder` (empty: all data matches the manifest).

    Files whose contents all check out but whose time differs from the manifest's record (a copy
    that did not keep file times) are not problems: load samples their checksums; `refresh`
    records their current size and time, so that loads skip that sample.

    A download folder (no manifest.json) is checked against the checksums recorded in its sidecar
    (`checksums`, default `default_sidecar(folder)`); `record` computes and writes them.
    """
    from .loading.download_folder import is_download

    folder = Path(folder)
    if is_download(folder):
        if refresh:
            raise refusal(
                lambda say: (
                    f"{say('refresh')} records a repacked folder's file times, and "
                    f"{folder} is a download: record its checksums again with {say('record')}."
                )
            )
        sidecar = Path(checksums) if checksums is not None else default_sidecar(folder)
        return verify_download(folder, sidecar, record=record, log=log)
    if record or checksums is not None:  # doing nothing with them said nothing was recorded
        raise refusal(
            lambda say: (
                f"{say('record')} and {say('checksums')} are a download's, and {folder} is a "
                "repacked folder: its checksums are in its manifest.json, checked without them."
            )
        )
    manifest = read_manifest(folder)
    with progress_bar(folder_bytes(folder, manifest), "[verify] checksums", "B") as bar:
        problems = verify_folder(folder, manifest, above(bar, log), bar.update)
    stale = [
        name
        for name, recorded in manifest.files.items()
        if stat_change(recorded, _stat(folder / name))
    ]
    if (
        refresh and not problems and (stale or not manifest.files)
    ):  # older manifests have no record yet
        lock = lock_for_replacing(
            folder
        )  # no model may be loaded from it while its manifest changes
        try:
            files = {name: file_stat(folder / name) for name in data_files(manifest)}
            with _writing(
                folder / MANIFEST_FILE,
                "the folder loads as it is (each load samples the checksums of files whose "
                "times differ); to refresh it, do so on a writable copy",
            ):
                write_manifest(folder, dataclasses.replace(manifest, files=files))
        finally:
            if lock is not None:
                lock.release()
        log(f"[verify] recorded the current size and time of {len(files)} file(s) in manifest.json")
    elif stale and not problems:  # a copy that did not keep times: it loads, after a sample
        log(
            f"[verify] {len(stale)} file(s) have other times than when repacked (a copy) and "
            "every checksum matches; --refresh records the new times so that loads skip their "
            "sampled check"
        )
    return problems


@contextlib.contextmanager
def _writing(path: Path, fix: str) -> Iterator[None]:
    """A file verify records (atomically: nothing half written) that the disk refuses (read-only,
    full, a parent that is a file) is one line saying what to do."""
    try:
        yield
    except OSError as e:
        raise StreamerError(f"cannot write {path}: {e.strerror or e}; {fix}.") from e


def _stat(path: Path) -> dict[str, int] | None:
    try:
        return file_stat(path)
    except OSError:
        return None


def verify_download(folder: Path, sidecar: Path, *, record: bool, log) -> list[Problem]:
    """Check a download against the checksums in `sidecar`; with `record`, (re)write them from
    the files as they are now, unless a whole-file hash the download carries (a Hugging Face
    cache blob's sha256) says a shard is damaged."""
    from .loading.download_folder import open_download
    from .loading.hub import hub_name

    download, _, _ = open_download(folder)  # headers, index and layout: a clear error if broken
    recorded = read_checksums(sidecar)
    if recorded is None and not record:
        raise StreamerError(
            f"no checksums are recorded for {folder} (looked for {sidecar}): a download carries "
            f"none. Run `streamer verify {hub_name(folder)} --record` right after downloading to "
            "compute them (it reads every byte once), then `streamer verify` checks against them."
        )
    with progress_bar(sum(download.file_bytes.values()), "[verify] checksums", "B") as bar:
        current = compute_checksums(download, above(bar, log), bar.update)
    problems = [] if record else _compare(download, recorded, current)
    if record:
        problems = _hub_hashes(download, log)
        if not problems:
            with _writing(sidecar, "name a writable file with --checksums FILE"):
                write_checksums(sidecar, current)
            log(f"[verify] recorded the checksums of {len(current.files)} shard(s) in {sidecar}")
    return problems


def compute_checksums(download, log, advance=lambda _: None) -> Checksums:
    """crc32 of every non-expert tensor and of each expert's slice of every stacked tensor;
    `advance(n)` is told of the shard bytes read, a layer's share of a shard at a time."""
    folder = download.folder
    start, done = time.perf_counter(), 0
    with Checkpoint(folder) as ckpt:
        resident_infos = [ckpt.tensors[name] for name in download.resident]
    resident: dict[str, int] = {}
    experts = {
        layer.module: [[0] * len(layer.tensors) for _ in range(layer.num_experts)]
        for layer in download.layers
    }
    for shard in sorted(download.file_bytes):
        with (
            open(folder / shard, "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
        ):
            data, counted = memoryview(m), 0
            for info in resident_infos:
                if info.path.name == shard:
                    resident[info.name] = zlib.crc32(data[info.start : info.end])
            for layer in download.layers:
                for t_index, tensor in enumerate(layer.tensors):
                    if tensor.file != shard:
                        continue
                    for expert in range(layer.num_experts):
                        offset, length = tensor.span(expert)
                        experts[layer.module][expert][t_index] = zlib.crc32(
                            data[offset : offset + length]
                        )
                        advance(length)
                        counted += length
            data.release()
        advance(download.file_bytes[shard] - counted)  # the resident tensors and the header
        done += download.file_bytes[shard]
        log(f"[verify] {shard}: read ({rate_text(done, time.perf_counter() - start)})")
    files = {shard: file_stat(folder / shard) for shard in download.file_bytes}
    return Checksums(str(folder.resolve()), files, resident, experts)


def _compare(download, recorded: Checksums, current: Checksums) -> list[Problem]:
    problems = []
    with Checkpoint(download.folder) as ckpt:
        shard_of = {name: ckpt.tensors[name].path.name for name in download.resident}
    for name, crc in current.resident.items():
        if recorded.resident.get(name) != crc:
            problems.append(Problem(shard_of[name], f"tensor '{name}' does not match its checksum"))
    for index, layer in enumerate(download.layers):
        expected = recorded.experts.get(layer.module, [])
        for expert, crcs in enumerate(current.experts[layer.module]):
            want = expected[expert] if expert < len(expected) else []
            for t_index, (tensor, crc) in enumerate(zip(layer.tensors, crcs)):
                if t_index >= len(want) or want[t_index] != crc:
                    where = f"MoE layer {index} ({layer.module}) expert {expert}"
                    problems.append(
                        Problem(
                            tensor.file,
                            f"{where}: tensor {tensor.name} does not match its checksum",
                        )
                    )
    for shard, stat in current.files.items():
        old = recorded.files.get(shard)
        if old is None or stat_change(old, stat):
            problems.append(
                Problem(
                    shard,
                    "changed since its checksums were recorded (size or time differs): "
                    "`streamer verify --record` records the files as they are now",
                )
            )
    return problems


def _hub_hashes(download, log) -> list[Problem]:
    """The whole-file sha256 of each shard that is a Hugging Face cache blob, against its name."""
    problems = []
    for shard in download.file_bytes:
        want = hub_blob_sha256(download.folder / shard)
        if want is not None:
            ok = file_sha256(download.folder / shard) == want
            log(f"[verify] {shard}: sha256 {'matches' if ok else 'DOES NOT match'} its blob's name")
            if not ok:
                problems.append(
                    Problem(
                        shard,
                        "its sha256 differs from the name of the Hugging Face cache blob it "
                        "is: the file is damaged; download it again (no checksums were recorded)",
                    )
                )
    return problems
