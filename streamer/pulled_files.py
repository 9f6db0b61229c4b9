"""What a pull fetches, checked: the repo holds a model that streams (asked of its file list and
config.json before any weight is downloaded), and each weight file this pull downloaded holds the
bytes whose sha256 the Hub lists for it (huggingface_hub checks sizes, not hashes).
"""

from __future__ import annotations

import hashlib
import os
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


def refuse_unstreamable(name: str, config_file: Path) -> None:
    """config.json checked as load and repack check it (a dense model, a refused family or
    quantization), before the weights are downloaded."""
    from .families.architectures import build_model
    from .families.config import check_config
    from .families.model_types import architecture
    from .families.transformers.spellings import normalize_config
    from .io.json_file import read_json_object
    from .repack.unread_quantization import refuse_unread_quantization

    where = f"{name}: config.json"
    raw = read_json_object(config_file, f"`streamer pull {name} --force` downloads it again.")
    try:
        config = normalize_config(check_config(raw, where))
        if "quantization" not in raw:
            refuse_unread_quantization(config, where)
        architecture(config, where)
        build_model(config, where)  # lazily: a model without MoE layers is refused
    except StreamerError as e:
        raise StreamerError(f"{e} (nothing but {name}'s small files was downloaded)") from None


def present(snapshot: Path, files: dict[str, str | None]) -> set[str]:
    """The weight files the snapshot holds already (fetched and checked by an earlier pull)."""
    return {path for path, sha in files.items() if sha and (snapshot / path).exists()}


def check_hashes(name: str, snapshot: Path, files: dict[str, str | None], old: set[str]) -> None:
    """Hash each weight file downloaded now (not in `old`) against the Hub's sha256; a file that
    differs is removed (its link and blob), so the next pull downloads it again."""
    landed = [p for p, sha in files.items() if sha and p not in old and (snapshot / p).exists()]
    total = sum((snapshot / p).stat().st_size for p in landed)
    with progress_bar(total, "[pull] checking sha256", unit="B") as bar:
        for path in sorted(landed):
            digest = sha256_of(snapshot / path, bar.update)
            if digest != files[path]:
                remove(snapshot / path)
                raise StreamerError(
                    f"{path} of {name} does not match the sha256 the Hub lists for it (the Hub: "
                    f"{files[path]}, the download: {digest}): it was damaged on the way and is "
                    f"removed; `streamer pull {name}` downloads it again."
                )


def sha256_of(path: Path, advance) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_READ):
            digest.update(block)
            advance(len(block))
    return digest.hexdigest()


def remove(link: Path) -> None:
    """A snapshot's file: the blob its link points to, then the link."""
    blob = Path(os.path.realpath(link))
    blob.unlink(missing_ok=True)
    link.unlink(missing_ok=True)
