"""Model names: a folder, or a Hugging Face repo id (`org/name`) found in the local hub cache.

The lookup is offline: huggingface_hub resolves the cached snapshot (a folder of symlinks into the
cache's blobs) and nothing is downloaded; a name that is not cached is refused with the command
that downloads it.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import StreamerError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve(name: str | Path, what: str = "model") -> Path:
    """The folder `name` stands for: an existing path as is, else a cached hub snapshot."""
    path = Path(name)
    if path.exists():
        return path
    text = str(name)
    if not REPO_ID.match(text):
        raise StreamerError(
            f"{what} {text!r} is not a folder, nor a Hugging Face name such as Qwen/Qwen3-30B-A3B."
        )
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(text, local_files_only=True))
    except LocalEntryNotFoundError:
        raise StreamerError(
            f"{text} is neither a folder nor in the Hugging Face cache ({constants.HF_HUB_CACHE}): "
            f"download it with `hf download {text}`, or check the name."
        ) from None
    except Exception as e:  # a malformed repo id or a damaged cache entry
        raise StreamerError(f"cannot look up {text} in the Hugging Face cache: {e}") from None


def streamable(name: str | Path) -> Path:
    """A folder written by `streamer repack`, or an MLX-quantized download (streamed in place);
    a download that is not MLX-quantized is refused, saying how to repack it."""
    from ..io.json_file import read_json_object
    from .download_folder import is_download

    folder = resolve(name)
    if is_download(folder):
        config = read_json_object(folder / "config.json", "download config.json again.")
        if "quantization" not in config:
            raise StreamerError(
                f"{name} is a checkpoint as downloaded, not MLX-quantized: repack it into a new "
                f"folder with `streamer repack {name} DST --quantize 4` and pass DST."
            )
    return folder
