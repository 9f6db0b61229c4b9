"""`streamer pull org/name`: a model from the Hugging Face Hub, made ready to stream.

huggingface_hub's `snapshot_download` fetches what mlx-lm's loader fetches (hub.ALLOW_PATTERNS)
into the normal Hugging Face cache ($HF_HUB_CACHE), with its progress bars. A pull that stops
keeps every file it finished (the next pull fetches only the rest), and a connection that drops
mid-file resumes from the byte it reached (a Range request). A repo that holds no model, or one
that cannot stream, is refused before its weights come (pulled_files.py), and each weight file is
checked against the sha256 the Hub lists once it is down. An MLX-quantized download then
streams where it lies. Any other is repacked (streamer/repack) into `pulled_folder(name)`, where
`--model org/name` finds it; with `delete_source`, the cache's copy goes shard by shard as the
repack writes (repack/consume.py), and the cache entry at the end, so the disk holds one copy.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from .errors import StreamerError
from .io.durable import next_step, write_failure
from .loading.hub import ALLOW_PATTERNS, REPO_ID, holds_weights, needs_repack, pulled_folder
from .pulled_files import (
    LandedHashes,
    cached_folder,
    drop_stale_parts,
    fetched_any,
    listing,
    present,
    refuse_no_model,
    refuse_unstreamable,
)
from .repack import repack
from .repack.consume import stand_ins
from .repack.publish import is_streamer_output, partial_folder
from .repack.recipe import Quantize
from .repack.resume_sidecar import OtherSource


def pull(
    name: str,
    *,
    revision: str | None = None,
    quantize: Quantize | None = None,
    delete_source: bool = False,
    dst: str | Path | None = None,
    force: bool = False,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
) -> Path:
    """Download `name` and return the folder that streams: its snapshot (MLX-quantized) or the
    folder it was repacked into (`dst`, default `pulled_folder(name)`)."""
    check_name(name)
    dst_given = dst is not None
    dst = Path(dst) if dst is not None else pulled_folder(name)
    partial = partial_folder(dst)
    if os.path.lexists(dst) and not partial.exists():
        if not is_streamer_output(dst):  # said now, not after the download (repack would refuse)
            raise StreamerError(
                f"{dst} exists and is not a folder `streamer repack` wrote: choose another --dst."
            )
        if not force:
            log(f"[pull] {name} is pulled already, repacked in {dst} (--force pulls it again)")
            return dst
    # shards an interrupted --delete-source repack consumed are in its partial folder already
    consumed = sorted(stand_ins(partial)) if partial.exists() else []
    drop_stale_parts(name)
    snapshot = download(name, revision, consumed, lambda: check_parent(dst, dst_given))
    if not needs_repack(snapshot):
        unused = " (nothing to repack: --quantize and --delete-source do not apply)"
        note = unused if quantize or delete_source else ""
        log(f"[pull] {name}: MLX-quantized, streams in place from {snapshot}{note}")
        return snapshot
    kept = "" if quantize else " unquantized (`--quantize 4` quantizes it as mlx_lm.convert -q)"
    log(f"[pull] {name} is not MLX-quantized: repacking it{kept} into {dst}")
    if delete_source:
        own_files(snapshot)
    options = {"quantize": quantize, "force": force, "delete_source": delete_source, "log": log}
    try:
        repack(snapshot, dst, resume=partial.exists(), **options)
    except OtherSource:  # pull has no --resume to leave out: it starts over itself
        log(f"[pull] {partial} is the repack of another revision or options: starting over")
        repack(snapshot, dst, resume=False, **options)
    if delete_source:
        forget(snapshot)
        log(f"[pull] {name}: the download is removed from the Hugging Face cache")
    else:
        log(
            f"[pull] {name}: the download stays in the Hugging Face cache ({snapshot}); "
            "--delete-source keeps only the repacked copy"
        )
    return dst


def check_name(name: str) -> None:
    """A name the Hub could hold: REPO_ID's shape, and huggingface_hub's own check (`a/..` has
    the shape, and the Hub's refusal of it was a traceback)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        valid = bool(REPO_ID.match(name)) and validate_repo_id(name) is None
    except HFValidationError:
        valid = False
    if not valid:
        raise StreamerError(f"{name!r} is not a Hugging Face name such as Qwen/Qwen3-30B-A3B.")


def download(name: str, revision: str | None, skip: list[str], before_repack=lambda: None) -> Path:
    """The repo's files checked (a model, one that streams; `before_repack` called for one that
    is not MLX-quantized), then snapshot_download; each weight file fetched now is checked
    against the Hub's sha256."""
    from huggingface_hub import hf_hub_download, snapshot_download

    patterns = {"allow_patterns": ALLOW_PATTERNS, "ignore_patterns": skip or None}
    with hub_errors(name, revision):
        try:
            commit, files = listing(name, revision)
        except connect_errors() as offline:  # a snapshot the cache holds (checked as it came)
            snapshot = Path(snapshot_download(name, revision=revision, **patterns))
            if not holds_weights(snapshot):  # its config.json alone, for `streamer plan`
                raise offline
            return snapshot
        refuse_no_model(name, files)
        config = refuse_unstreamable(
            name, Path(hf_hub_download(name, "config.json", revision=commit))
        )
        if "quantization" not in config:  # to be repacked: into a folder that can be made
            before_repack()
        snapshot = cached_folder(name) / "snapshots" / commit
        hashes = LandedHashes(snapshot, files, present(snapshot, files))
        try:
            snapshot = Path(snapshot_download(name, revision=revision, **patterns))
        except BaseException:
            hashes.cancel()
            raise
    hashes.finish(name, snapshot)
    return snapshot


@contextmanager
def hub_errors(name: str, revision: str | None):
    """The Hub's failures one line each (what was fetched stays for the next pull)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    def again() -> str:
        if fetched_any(name):
            return f"the files fetched so far are kept: `streamer pull {name}` resumes."
        return f"none of its files was fetched: run `streamer pull {name}` again."

    try:
        yield
    except StreamerError:
        raise
    except GatedRepoError:
        raise StreamerError(
            f"{name} is gated: accept its terms on the Hub, then log in with `hf auth login`."
        ) from None
    except RepositoryNotFoundError:
        raise StreamerError(
            f"{name} is not on the Hub ({constants.ENDPOINT}): check the name (a private model "
            "needs `hf auth login`)."
        ) from None
    except RevisionNotFoundError:
        raise StreamerError(f"{name} has no revision {revision!r} on the Hub.") from None
    except (LocalEntryNotFoundError, *connect_errors()) as e:  # the Hub unreachable
        cause = e.__cause__ or e
        raise StreamerError(
            f"cannot reach the Hub ({constants.ENDPOINT}) for {name}: {type(cause).__name__}: "
            f"{cause}; {again()}"
        ) from None
    except Exception as e:  # a transfer that failed past huggingface_hub's retries
        cache = Path(constants.HF_HUB_CACHE)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            why, fix = write_failure(e, cache)
            resume = next_step(fix, f"run `streamer pull {name}` again: it resumes.")
            raise StreamerError(f"the download of {name} failed: {why}. {resume}") from None
        written = isinstance(e, OSError) and e.filename and Path(os.fsdecode(e.filename))
        if written and (cache.is_relative_to(written) or written.is_relative_to(cache)):
            raise StreamerError(  # a folder of another user's, a file on the way: no resuming
                f"cannot write the Hugging Face cache ({e.strerror}: {e.filename}): set "
                "$HF_HUB_CACHE to a writable folder."
            ) from None
        raise StreamerError(
            f"the download of {name} failed ({type(e).__name__}: {e}); {again()}"
        ) from None


def connect_errors() -> tuple[type[Exception], ...]:
    """The HTTP client's failures to connect (huggingface_hub 2.4 uses httpx2, earlier httpx)."""
    try:
        import httpx2 as httpx
    except ImportError:
        import httpx
    return httpx.ConnectError, httpx.ConnectTimeout


def check_parent(dst: Path, given: bool) -> None:
    """A destination under a file or in a folder this user cannot write ($STREAMER_CACHE_DIR or
    --dst naming one), said before the weights come: repack refused it after the whole download."""
    parent = dst.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    fix = "choose another --dst" if given else "set $STREAMER_CACHE_DIR to a writable folder"
    if not parent.is_dir():
        raise StreamerError(f"{parent} is a file, not a folder, so {dst} cannot be made: {fix}.")
    if not os.access(parent, os.W_OK):  # its permissions, or a read-only disk
        raise StreamerError(f"{parent} is not writable, so {dst} cannot be made: {fix}.")


def own_files(snapshot: Path) -> None:
    """Make each of the snapshot's links the file it points to (a rename of its blob, no copy),
    so that --delete-source frees the space when it deletes a shard; a blob that another link
    shares (another revision's, a duplicate file) is copied instead, its modification time kept:
    a repack this pull resumes checks its shards by it (repack/resume_sidecar.py)."""
    links = [p for p in (snapshot.parent).rglob("*") if p.is_symlink()]
    shared = Counter(os.path.realpath(p) for p in links)
    for link in sorted(p for p in snapshot.rglob("*") if p.is_symlink()):
        blob = os.path.realpath(link)
        if shared[blob] > 1:
            tmp = link.with_name(f".{link.name}.copy")
            shutil.copy2(blob, tmp)
            blob = tmp
        os.replace(blob, link)  # the link itself is replaced, atomically


def forget(snapshot: Path) -> None:
    """Remove the repacked download from the Hugging Face cache: the whole repo entry when this
    was its only revision, else this snapshot and the refs that name it."""
    storage = snapshot.parent.parent
    if [p.name for p in snapshot.parent.iterdir()] == [snapshot.name]:
        shutil.rmtree(storage)
        return
    shutil.rmtree(snapshot)
    for ref in (storage / "refs").rglob("*"):
        if ref.is_file() and ref.read_text().strip() == snapshot.name:
            ref.unlink()
