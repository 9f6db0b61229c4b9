"""`streamer verify`: every checksum of a repacked model or a download, each bad tensor named."""

from __future__ import annotations

import argparse
import contextlib
import sys

from .interrupts import raising_on_ctrl_c


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify",
        help="check every checksum of a repacked model or an MLX download; names each bad tensor",
    )
    p.add_argument(
        "dir",
        metavar="DIR",
        help="a repacked folder, an MLX download, or org/name (pulled, or the hub cache)",
    )
    p.add_argument(
        "--refresh",
        action="store_true",
        help="if every checksum passes, record the files' current times (after a copy)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="a download: compute its checksums and keep them in a sidecar (see --checksums)",
    )
    p.add_argument(
        "--checksums",
        metavar="FILE",
        help="a download's checksum sidecar (default: under the user cache folder, not in DIR)",
    )
    p.set_defaults(run=verify)


def verify(args: argparse.Namespace) -> int:
    from ..loading.download_folder import is_download
    from ..loading.hub import model_path
    from ..verify import verify

    folder = model_path(args.dir)
    # --record and --refresh write a file, atomically: a Ctrl-C raises, so no temporary is left
    writes = args.record or args.refresh
    with raising_on_ctrl_c() if writes else contextlib.nullcontext():
        problems = verify(
            folder, refresh=args.refresh, record=args.record, checksums=args.checksums
        )
    for problem in problems:
        print(f"streamer: bad: {problem}", file=sys.stderr)
    if problems:
        remedy = (
            "download the named files again, then record their checksums again with --record."
            if is_download(folder)
            else "repack the model from its source."
        )
        print(
            f"streamer: {len(problems)} problem(s) in {args.dir}: {remedy}",
            file=sys.stderr,
        )
        return 1
    if not args.record:
        print(f"[verify] {args.dir}: every checksum matches", file=sys.stderr)
    return 0
