"""`streamer pull org/name`: download a model from the Hugging Face Hub, repacked if it must be."""

from __future__ import annotations

import argparse
import sys

from ..io.checksums import cache_dir
from .interrupts import raising_on_ctrl_c
from .options import add_quantize, quantize_option


def add_parser(sub) -> None:
    p = sub.add_parser(
        "pull",
        help="download org/name from the Hugging Face Hub (resumable); a download that is not "
        "MLX-quantized is repacked",
    )
    p.add_argument(
        "name",
        metavar="ORG/NAME",
        help="a Hugging Face name, e.g. mlx-community/Qwen3-30B-A3B-4bit",
    )
    p.add_argument("--revision", metavar="REV", help="a branch, tag or commit (default: main)")
    add_quantize(p, "repack a download that is not MLX-quantized to this many bits")
    p.add_argument(
        "--delete-source",
        action="store_true",
        help="while repacking, delete the download's shards as they are written, then the "
        "download: the disk holds one copy",
    )
    p.add_argument(
        "--dst",
        metavar="DIR",
        help=f"where to repack (default: {cache_dir() / 'models'}/org--name, under "
        "$STREAMER_CACHE_DIR if set; --model org/name finds it there)",
    )
    p.add_argument("--force", action="store_true", help="download and repack again")
    p.set_defaults(run=pull)


def pull(args: argparse.Namespace) -> None:
    from ..pull import pull

    quantize = quantize_option(args)
    with raising_on_ctrl_c():  # a download keeps its finished files, a repack its progress
        folder = pull(
            args.name,
            revision=args.revision,
            quantize=quantize,
            delete_source=args.delete_source,
            dst=args.dst,
            force=args.force,
        )
    model = args.name if args.dst is None else str(folder)
    print(f"[pull] ready: streamer generate --model {model} --prompt ...", file=sys.stderr)
