"""What a pull fetches, checked: the repo holds a model that streams (asked of its file list and
config.json before any weight is downloaded), and each weight file this pull downloads holds the
bytes whose sha256 the Hub lists for it, hashed as it lands (huggingface_hub checks sizes only);
and what the Hugging Face cache holds of a repo (the part-files killed pulls left).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from .errors import StreamerError
from .progress import progress_bar

MODEL_FILES = ("config.json", "model*.safetensors")
HASH_READ = 16 << 20


def listing(name: str, revision: str | None) -> tuple[str, dict[str, str | None]]:
    """The commit `revision` names and its files (path -> the sha256 the Hub lists for an LFS
    file, None for a small one), as huggingface_hub's `list_repo_tree` gives them."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()
    commit = api.repo_info(name, revision=revision or "main").sha
    files = {
        entry.path: entry.lfs.sha256 if entry.lfs is not None else None
        for entry in api.list_repo_tree(name, revision=commit, recursive=True)
        if isinstance(entry, RepoFile)
    }
    return commit, files


def refuse_no_model(name: str, files: dict[str, str | None]) -> None:
    """A repo without config.json and safetensors weights (a README and a license, GGUF files,
    PyTorch .bin files) holds nothing mlx-lm loads, so nothing streams from it."""
    import fnmatch

    missing = [p for p in MODEL_FILES if not any(fnmatch.fnmatch(f, p) for f in files)]
    if not missing:
        return
    held = ", ".join(sorted(files)[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")
    raise StreamerError(
        f"{name} holds {held or 'no files'}, but no {' and no '.join(missing)}: streamer streams "
        "a checkpoint of config.json and model*.safetensors (as mlx-lm loads them), so there is "
        "nothing to pull."
    )


def refuse_unstreamable(name: str, config_file: Path) -> dict:
    """config.json checked as load and repack check it (a dense model, a refused family or
    quantization), before the weights are downloaded; its contents."""
    from .families.architectures import build_model
    from .families.config import check_config
    from .families.model_types import architecture
    from .families.transformers.spellings import normalize_config
    from .families.unread_quantization import (
        refuse_left_to_sanitize,
        refuse_unread_quantization,
    )
    from .io.json_file import read_json_object

    where = f"{name}: config.json"
    raw = read_json_object(config_file, f"`streamer pull {name} --force` downloads it again.")
    try:
        config = normalize_config(check_config(raw, where))
        if "quantization" not in raw:
            refuse_unread_quantization(config, where)
        architecture(config, where)
        model = build_model(config, where)  # lazily: a model without MoE layers is refused
        refuse_left_to_sanitize(model, raw, where)
    except StreamerError as e:
        raise StreamerError(f"{e} (nothing but {name}'s small files was downloaded)") from None
    return raw


def present(snapshot: Path, files: dict[str, str | None]) -> set[str]:
    """The weight files the snapshot holds already (fetched and checked by an earlier pull)."""
    return {path for path, sha in files.items() if sha and (snapshot / path).exists()}


class LandedHashes:
    """Each weight file downloaded now (not in `old`) hashed as it lands in the snapshot (its
    link appears once its blob is whole), in a thread beside the download: SHA-256 runs at
    1-2 GB/s, so a pull rarely waits for it. `finish` hashes what is left, then refuses a file
    whose sha256 is not the Hub's, removing it (link and blob) so the next pull fetches it."""

    def __init__(self, snapshot: Path, files: dict[str, str | None], old: set[str]):
        self.snapshot = snapshot
        self.expected = {path: sha for path, sha in files.items() if sha and path not in old}
        self.digests: dict[str, str] = {}
        self.downloaded, self.cancelled = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._watch, name="streamer-sha256", daemon=True)
        self.thread.start()

    def _landed(self) -> list[str]:
        return sorted(
            p for p in self.expected if p not in self.digests and (self.snapshot / p).exists()
        )

    def _watch(self) -> None:
        while not self.downloaded.is_set():
            for path in self._landed():
                digest = sha256_of(self.snapshot / path, lambda _: None, self.cancelled)
                if digest is None:
                    return
                self.digests[path] = digest
            self.downloaded.wait(0.5)

    def cancel(self) -> None:
        """The download failed or was interrupted: stop at once."""
        self.cancelled.set()
        self.downloaded.set()
        self.thread.join()

    def finish(self, name: str, snapshot: Path) -> None:
        self.downloaded.set()
        self.thread.join()
        self.snapshot = snapshot  # the commit snapshot_download resolved (main may have moved)
        rest = self._landed()
        total = sum((snapshot / p).stat().st_size for p in rest)
        with progress_bar(total, "[pull] checking sha256", unit="B") as bar:
            for path in rest:
                self.digests[path] = sha256_of(snapshot / path, bar.update)
        for path, digest in sorted(self.digests.items()):
            if digest != self.expected[path]:
                remove(snapshot / path)
                raise StreamerError(
                    f"{path} of {name} does not match the sha256 the Hub lists for it (the Hub: "
                    f"{self.expected[path]}, the download: {digest}): it was damaged on the way "
                    f"and is removed; `streamer pull {name}` downloads it again."
                )


def sha256_of(path: Path, advance, stop: threading.Event | None = None) -> str | None:
    """The file's sha256 (hex), or None if `stop` was set while it was read."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_READ):
            if stop is not None and stop.is_set():
                return None
            digest.update(block)
            advance(len(block))
    return digest.hexdigest()


def remove(link: Path) -> None:
    """A snapshot's file: the blob its link points to, then the link."""
    blob = Path(os.path.realpath(link))
    blob.unlink(missing_ok=True)
    link.unlink(missing_ok=True)


def drop_stale_parts(name: str) -> None:
    """Delete the part-files killed pulls left: huggingface_hub (2.4) writes each file to a new
    `blobs/<etag>.<random>.incomplete`, removed on any error but not when the process is killed,
    and never reused. One that a running download holds (the etag's lock) is left alone."""
    from filelock import FileLock, Timeout

    folder = cached_folder(name)
    for part in (folder / "blobs").glob("*.incomplete"):
        lock = FileLock(folder.parent / ".locks" / folder.name / f"{part.name.split('.')[0]}.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        try:
            part.unlink(missing_ok=True)
        finally:
            lock.release()


def fetched_any(name: str) -> bool:
    """Whether the Hugging Face cache holds any of the repo's files, a part-file included."""
    folder = cached_folder(name)
    return any(p.is_file() for sub in ("blobs", "snapshots") for p in (folder / sub).rglob("*"))


def cached_folder(name: str) -> Path:
    """The repo's folder in the Hugging Face cache."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="model")
