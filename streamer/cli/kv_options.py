"""The KV cache's flags (generate, chat and serve): mlx-lm's quantized cache, and the prompt
caches kept on disk."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..arguments import (
    KV_BITS,
    KV_GROUP_SIZE,
    KV_GROUP_SIZES,
    QUANTIZED_KV_START,
    check_kv_quantization,
)
from ..errors import StreamerError
from .options import option_group, size


def add_kv_cache(p: argparse.ArgumentParser) -> None:
    """mlx-lm's quantized KV cache flags, as mlx_lm.generate spells them."""
    p = option_group(p, "KV cache")
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=KV_BITS,
        help="quantize the KV cache to this many bits (default: not quantized)",
    )
    p.add_argument(
        "--kv-group-size",
        type=int,
        choices=KV_GROUP_SIZES,
        default=KV_GROUP_SIZE,
        help="group size of the KV cache's quantization (default: %(default)s)",
    )
    p.add_argument(
        "--quantized-kv-start",
        type=int,
        default=QUANTIZED_KV_START,
        metavar="N",
        help="with --kv-bits, quantize once the cache holds N tokens (default: %(default)s)",
    )


def add_max_kv_size(p: argparse.ArgumentParser) -> None:
    """mlx_lm.generate's and mlx_lm.chat's --max-kv-size, with their default (no bound)."""
    p = option_group(p, "KV cache")
    p.add_argument(
        "--max-kv-size",
        type=int,
        default=None,
        metavar="N",
        help="keep at most N tokens of KV, the first 4 and the latest, in mlx-lm's rotating "
        "cache (default: all)",
    )


def kv_options(args: argparse.Namespace) -> dict:
    """streamer.generate's keywords for the KV cache flags: --max-kv-size where the command has
    it and it is given; mlx-lm's quantization with --kv-bits."""
    check_kv_quantization(args.kv_bits, args.kv_group_size, args.quantized_kv_start)
    bound = getattr(args, "max_kv_size", None)
    options = {} if bound is None else {"max_kv_size": bound}
    if args.kv_bits is None:
        return options
    if bound is not None:  # every cache it makes is rotating: refused before the model loads
        from ..kv_quantization import cannot_quantize

        raise cannot_quantize("RotatingKVCache", "max_kv_size")
    return {
        **options,
        "kv_bits": args.kv_bits,
        "kv_group_size": args.kv_group_size,
        "quantized_kv_start": args.quantized_kv_start,
    }


def check_kv_fits(model, options: dict) -> None:
    """The KV flags against the loaded model, before the first prompt (a group size that does
    not divide its key and value widths failed every message of chat, every request of serve)."""
    if options.get("kv_bits") is not None:
        from ..kv_quantization import check_kv_cache_quantizes

        check_kv_cache_quantizes(model, options)


def add_prompt_cache_dir(p: argparse.ArgumentParser) -> None:
    p = option_group(p, "prompt caches")
    p.add_argument(
        "--prompt-cache-dir",
        metavar="DIR",
        help="keep KV caches in DIR too (mlx-lm's prompt cache files), so a long system prompt "
        "or a conversation is not computed again after a restart (default: in memory only)",
    )
    p.add_argument(
        "--prompt-cache-disk",
        type=size,
        default="10G",
        metavar="SIZE",
        help="at most this much in --prompt-cache-dir, the least recently used files removed "
        "(default: 10G)",
    )


def disk_option(args: argparse.Namespace, group) -> tuple[Path, int] | None:
    """open_engine's `disk`: (folder, byte bound), or None without --prompt-cache-dir; refused
    under an expert-parallel `group`, before the model loads."""
    if args.prompt_cache_dir is None:
        return None
    if group is not None:
        raise StreamerError(
            "--prompt-cache-dir is for one process: under mlx.launch every rank would have to "
            "find the same caches, which is not implemented; leave it out."
        )
    folder = Path(args.prompt_cache_dir)
    from ..server.disk_files import check_bound, check_private

    check_private(folder)
    check_bound(folder, args.prompt_cache_disk)
    return folder, args.prompt_cache_disk
