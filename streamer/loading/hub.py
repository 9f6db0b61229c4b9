"""Model names: a folder, or a Hugging Face repo id (`org/name`) found in the local hub cache.

The lookup is offline: huggingface_hub resolves the cached snapshot (a folder of symlinks into the
cache's blobs) and nothing is downloaded; a name that is not cached is refused with the command
that downloads it (`streamer pull`, streamer/pull.py). A name `streamer pull` repacked (a download
that was not MLX-quantized) stands for its repacked folder, `pulled_folder(name)`.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from ..errors import StreamerError
from ..io.files import for_people

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a pull downloads and a lookup expects: mlx-lm's (mlx_lm.utils.DEFAULT_ALLOW_PATTERNS,
# copied: importing mlx_lm.utils imports transformers, seconds `plan` does not spend)
ALLOW_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]


class NotDownloaded(StreamerError):
    """A Hugging Face name that is not in the cache (nor pulled): `streamer pull` fetches it."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


class NotCached(NotDownloaded):
    """A Hugging Face name of which the cache holds nothing (`plan` needs its config.json alone)."""


def is_repo_id(name: str | Path) -> bool:
    """Whether `name` is a hub name rather than a folder that exists."""
    # os.path.exists: Path.exists raises OSError for a name over 255 bytes (a traceback)
    return not os.path.exists(name) and bool(REPO_ID.match(str(name)))


def pulled_folder(name: str) -> Path:
    """Where `streamer pull` repacks `org/name`: the user cache folder's models/org--name
    ($STREAMER_CACHE_DIR, else ~/.cache/streamer or ~/Library/Caches/streamer), beside the
    Hugging Face cache (~/.cache/huggingface/hub) as pip's and huggingface_hub's caches lie."""
    from ..io.checksums import cache_dir

    return cache_dir() / "models" / name.replace("/", "--")


def resolve(name: str | Path, what: str = "model", *, config_only: bool = False) -> Path:
    """The folder `name` stands for: an existing path as is, else a cached hub snapshot that
    holds the model's weights (or its config.json alone, for `config_only`: what plan reads)."""
    if name == "":  # Path("") is ".": the working directory was taken for the model
        raise StreamerError(f"{what} '' is empty: give a model's folder or its org/name.")
    path = Path(name)
    if os.path.exists(path):  # not Path.exists: see is_repo_id
        return path
    text = str(name)
    if not REPO_ID.match(text):
        raise StreamerError(
            f"{what} {text!r} is not a folder, nor a Hugging Face name such as Qwen/Qwen3-30B-A3B."
        )
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    damage = cache_damage(Path(constants.HF_HUB_CACHE), text)
    if damage:
        raise NotDownloaded(
            text,
            f"the Hugging Face cache's copy of {text} is damaged: {damage}. `streamer pull "
            f"{text}` downloads it again.",
        )
    try:
        snapshot = Path(
            snapshot_download(text, local_files_only=True, allow_patterns=ALLOW_PATTERNS)
        )
    except IncompleteSnapshotError:
        raise NotDownloaded(
            text,
            f"the download of {text} in the Hugging Face cache is incomplete: `streamer pull "
            f"{text}` finishes it.",
        ) from None
    except LocalEntryNotFoundError:
        if pulled_folder(text).exists():  # `streamer pull` would answer "pulled already"
            raise NotDownloaded(
                text,
                f"{text}'s download is not in the Hugging Face cache ({constants.HF_HUB_CACHE}): "
                f"it was pulled and repacked into {pulled_folder(text)}, which --model "
                f"{text} runs; `hf download {text}` fetches the download again.",
            ) from None
        raise NotCached(
            text,
            f"{text} is neither a folder nor in the Hugging Face cache ({constants.HF_HUB_CACHE}): "
            f"download it with `streamer pull {text}`, or check the name.",
        ) from None
    except Exception as e:  # a malformed repo id or a damaged cache entry
        raise StreamerError(f"cannot look up {text} in the Hugging Face cache: {e}") from None
    if config_only or holds_weights(snapshot):
        return snapshot
    raise NotDownloaded(
        text,
        f"the Hugging Face cache's copy of {text} holds no model*.safetensors (`hf download "
        f"{text} config.json` fetches the config alone, for `streamer plan`): download the "
        f"model with `streamer pull {text}`.",
    )


def holds_weights(snapshot: Path) -> bool:
    """Whether a cached snapshot has the weights: `hf download org/name config.json` (the
    README's way to `streamer plan` before downloading) caches one without, which huggingface_hub
    returns as the download (it knows a snapshot incomplete only from the listing a whole download
    caches)."""
    index = snapshot / "model.safetensors.index.json"
    return index.exists() or any(snapshot.glob("model*.safetensors"))


def hub_name(folder: Path) -> str:
    """How a command names `folder`: org/name for a snapshot in the Hugging Face cache
    (models--org--name/snapshots/REV, which every command takes as org/name), else its path."""
    repo = folder.parent.parent.name
    if folder.parent.name == "snapshots" and repo.startswith("models--") and repo.count("--") == 2:
        return repo.removeprefix("models--").replace("--", "/")
    return str(folder)


def cache_damage(cache: Path, name: str) -> str | None:
    """What is wrong with `name`'s entry in the hub cache, in words, where a lookup would report
    it as absent or hand back a folder without the model: refs/main empty or naming no snapshot,
    a snapshot link whose blob is missing. None if nothing is (or there is no entry)."""
    repo = cache / f"models--{name.replace('/', '--')}"
    ref = repo / "refs" / "main"
    try:
        commit = ref.read_text().strip()
    except OSError:  # no entry, or no main ref: huggingface_hub says so
        return None
    snapshot = repo / "snapshots" / commit
    if not commit:
        return f"{ref} is empty: it names no snapshot"
    if commit in (".", "..") or Path(commit).name != commit or not snapshot.is_dir():
        return f"{ref} names snapshot {commit!r}, which is not in {snapshot.parent}"
    for link in sorted(snapshot.rglob("*")):
        if needed(link.name) and link.is_symlink() and not link.exists():
            return f"{link} is a symbolic link to {os.readlink(link)}, which is missing"
    return None


def needed(name: str) -> bool:
    """Whether a file named `name` is one a lookup expects (mlx-lm's patterns), not a file for
    people (a README, a LICENSE.txt)."""
    return _matches(name, ALLOW_PATTERNS) and not for_people(name)


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def model_path(name: str | Path, *, config_only: bool = False) -> Path:
    """The folder `--model name` (and `verify`, `info`, `plan`) stands for: a folder, the
    repacked folder of a pulled name, else the name's snapshot in the Hugging Face cache."""
    if is_repo_id(name) and pulled_folder(str(name)).exists():
        return pulled_folder(str(name))
    return resolve(name, config_only=config_only)


def needs_repack(folder: Path) -> bool:
    """Whether `folder` is a download that is not MLX-quantized (it cannot stream in place); one
    that cannot stream at all, repacked or not (a dense model), is refused."""
    from ..io.json_file import read_json_object
    from .download_folder import is_download

    if not is_download(folder):
        return False
    config = read_json_object(folder / "config.json", "download config.json again.")
    if "quantization" in config:
        return False
    from ..families.architectures import check_streams

    check_streams(config, folder / "config.json")  # a dense model is told so, not to repack
    return True


def streamable(name: str | Path) -> Path:
    """A folder written by `streamer repack`, or an MLX-quantized download (streamed in place);
    a download that is not MLX-quantized is refused, saying how to repack it."""
    folder = model_path(name)
    if needs_repack(folder):
        pull = f"`streamer pull {name} --quantize 4`, or " if is_repo_id(name) else ""
        raise StreamerError(
            f"{name} is a checkpoint as downloaded, not MLX-quantized: repack it with {pull}"
            f"`streamer repack {name} DST --quantize 4` into a new folder and pass DST."
        )
    return folder
