"""`streamer repack` and `streamer split`: write the streaming layout, or one rank's share."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import StreamerError
from .interrupts import raising_on_ctrl_c
from .options import add_quantize, quantize_option


def add_parsers(sub) -> None:
    p = sub.add_parser("repack", help="convert a downloaded checkpoint into the streaming layout")
    p.add_argument(
        "src", metavar="SRC", help="checkpoint folder (config.json + safetensors), or org/name"
    )
    p.add_argument("dst", metavar="DST", help="output folder")
    add_quantize(p, "quantize to this many bits (as mlx_lm.convert --quantize --q-bits)")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted repack into DST from its last finished layer",
    )
    p.add_argument(
        "--delete-source",
        action="store_true",
        help="delete each of SRC's shards once all of its data is written into DST (the disk "
        "then needs about one shard beyond DST, not a second copy); resumable",
    )
    p.set_defaults(run=repack)

    p = sub.add_parser(
        "split", help="write one rank's share of a repacked model, for expert-parallel runs"
    )
    p.add_argument("src", metavar="SRC", help="a folder written by `streamer repack`")
    p.add_argument(
        "dst", metavar="DST", help="output folder: the resident weights and this rank's experts"
    )
    p.add_argument("--shard", required=True, metavar="RANK/RANKS", help="e.g. 0/2")
    p.add_argument(
        "--trace",
        metavar="TRACE.npz",
        help="routing trace (.npz, tools/routing_summary.py --trace) to balance the ranks' "
        "traffic; default: interleave experts",
    )
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.set_defaults(run=split)


def repack(args: argparse.Namespace) -> None:
    from ..loading.hub import resolve
    from ..repack import repack

    quantize = quantize_option(args)
    src = resolve(args.src, "source")
    if args.delete_source and src != Path(args.src):
        raise StreamerError(
            f"--delete-source: {args.src} lives in the Hugging Face cache, whose files are shared "
            "links: repack without it, then remove the download with `hf cache` (see its --help)."
        )
    with raising_on_ctrl_c():  # repack keeps its progress and says how to resume
        repack(
            src,
            args.dst,
            quantize=quantize,
            force=args.force,
            resume=args.resume,
            delete_source=args.delete_source,
        )


def split(args: argparse.Namespace) -> None:
    from ..parallel.shards import parse_shard
    from ..parallel.split import split

    rank, ranks = parse_shard(args.shard)
    with raising_on_ctrl_c():  # a partial share is removed on the way out
        split(args.src, args.dst, rank, ranks, trace=args.trace, force=args.force)
