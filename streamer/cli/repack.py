"""`streamer repack` and `streamer split`: write the streaming layout, or one rank's share."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import StreamerError
from .interrupts import raising_on_ctrl_c


def add_parsers(sub) -> None:
    p = sub.add_parser("repack", help="convert a downloaded checkpoint into the streaming layout")
    p.add_argument("src", help="checkpoint folder (config.json + safetensors), or org/name")
    p.add_argument("dst", help="output folder")
    p.add_argument(
        "--quantize",
        type=int,
        choices=(2, 3, 4, 5, 6, 8),
        help="quantize to this many bits (as mlx_lm.convert --quantize --q-bits)",
    )
    p.add_argument(
        "--group-size",
        type=int,
        choices=(16, 32, 64, 128),
        help="quantization group size (default: 64 affine; the mode's own otherwise)",
    )
    p.add_argument(
        "--q-mode",
        default="affine",
        choices=("affine", "nvfp4", "mxfp4", "mxfp8"),
        help="quantization mode, as mlx_lm.convert --q-mode (nvfp4 and mxfp4: 4 bits, mxfp8: 8)",
    )
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
    p.add_argument("src", help="a folder written by `streamer repack`")
    p.add_argument("dst", help="output folder: the resident weights and this rank's experts")
    p.add_argument("--shard", required=True, metavar="RANK/RANKS", help="e.g. 0/2")
    p.add_argument(
        "--trace",
        help="routing trace (.npz, tools/routing_summary.py --trace) to balance the ranks' "
        "traffic; default: interleave experts",
    )
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.set_defaults(run=split)


def repack(args: argparse.Namespace) -> None:
    from ..hub import resolve
    from ..repack import Quantize, repack
    from ..repack.plan import MODES

    quantize = None
    if args.quantize:
        fixed = MODES[args.q_mode]
        group_size = args.group_size or (64 if fixed is None else fixed[1])
        quantize = Quantize(args.quantize, group_size, args.q_mode)
    elif args.q_mode != "affine" or args.group_size:
        raise StreamerError("--q-mode and --group-size choose how --quantize quantizes: pass it.")
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
    from ..repack.split import split
    from ..shards import parse_shard

    rank, ranks = parse_shard(args.shard)
    with raising_on_ctrl_c():  # a partial share is removed on the way out
        split(args.src, args.dst, rank, ranks, trace=args.trace, force=args.force)
