#!/usr/bin/env python3
"""Hits beside the misses' reads, or after them? Decode on the slot path both ways, page cache
warm, alternating within each round (experts/slots.py OVERLAPPED_ROUTES; 0 is the serial way).

    python bench/overlap_ab.py --data DIR --points medium:0.25,uniform:0.25 --rounds 2

Each (round, point, way) is one process running pool_growth.py's point (the routing model in
place of the routers, a warm-up, one timed generation by wall clock and CPU time); the two ways
swap order every round so the machine's drift hits them alike. The squeezed comparison (misses
from disk) is bench/squeezed_io.py's `slots` against `slots-serial`. Writes
bench/results/<model>-overlap-ab.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import pagecache  # noqa: E402
from engines import child_result, log  # noqa: E402
from squeezed_io import default_model  # noqa: E402

WAYS = ("serial", "overlapped")


def child(args: argparse.Namespace) -> dict:
    import pool_growth

    from streamer.experts import slots

    if args.way == "serial":
        slots.OVERLAPPED_ROUTES = 0  # every call's entries computed after its reads
    profile, fraction = args.point.split(":")
    args.profile, args.fraction, args.commit = profile, float(fraction), False
    return {"way": args.way, "point": args.point, **pool_growth.one(args)}


def run(args: argparse.Namespace, point: str, way: str) -> dict:
    argv = [sys.executable, __file__, "--model", str(args.model), "--child", point, "--way", way]
    argv += ["--prompt-tokens", str(args.prompt_tokens), "--tokens", str(args.tokens)]
    row = child_result(argv, f"[overlap] the {point} {way} point")
    log(
        f"[overlap] {point} {way}: {row['decode_tok_s']:.3f} tok/s, "
        f"{row['cpu_s_per_token']:.3f} CPU s/token, {row['hit_rate']:.1%} hits"
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "streamer-bench")
    ap.add_argument("--model", type=Path, help="a repacked folder (default: the 12-layer one)")
    ap.add_argument("--points", default="medium:0.25,uniform:0.25,medium:0.125")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=24, help="decode tokens per run")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one point, in this process
    ap.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model = args.model or default_model(args.data)
    if args.child:
        args.point = args.child
        print(json.dumps(child(args)))
        return
    pagecache.warm(sorted((args.model / "experts").iterdir()))
    rows = []
    for n in range(args.rounds):
        for point in args.points.split(","):
            for way in WAYS if n % 2 == 0 else WAYS[::-1]:
                rows.append({"round": n, **run(args, point, way)})
    out = BENCH / "results" / f"{args.model.name.rsplit('-', 2)[0]}-overlap-ab.json"
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}))
    log(f"[overlap] wrote {out}")


if __name__ == "__main__":
    main()
