#!/usr/bin/env python3
"""Paired runs' ratios against mlx-lm's own step, beside the bus floor (bench/paired.py).

    python bench/paired_plot.py OUT.png PAIRED.json... [--mb-per-token MB] [--bus-gbps 45]

Each point is one pair: mlx-lm's median step (x) and the step ratio, mlx-lm's over streamer's
(y), one color per file (a machine). The curve is the bus floor, mlx-lm's step over that step
plus the bytes a token at the bus's rate with no overlap: the ratio a token reaches when it waits
for its misses and nothing else. The bytes are the pairs' own (`bus_mb_per_token`) or, for runs
before paired.py counted them, `--mb-per-token`. Where mlx-lm's step is long (the host's work),
the same bytes cost less of it: a ratio to mlx-lm moves with the machine, the one to the floor
much less. Needs matplotlib (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from paired import BUS_GBPS


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the PNG to write")
    ap.add_argument("runs", type=Path, nargs="+", help="bench/paired.py's JSON outputs")
    ap.add_argument("--mb-per-token", type=float, help="bytes a token where a run has none")
    ap.add_argument("--bus-gbps", type=float, default=BUS_GBPS)
    ap.add_argument("--goal", type=float, help="a goal's ratio, drawn as a line")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    moved = []
    for run in args.runs:
        pairs = json.loads(run.read_text(encoding="utf-8"))["pairs"]
        steps = [p["mlx_lm_step_ms"] for p in pairs]
        ax.scatter(steps, [p["step_ratio"] for p in pairs], label=run.stem)
        moved += [p.get("bus_mb_per_token", args.mb_per_token) for p in pairs]
    if None in moved:
        raise SystemExit("a run counts no bytes a token (paired.py before them): --mb-per-token")
    mb = float(np.median(moved))
    step = np.linspace(5, max(40.0, ax.get_xlim()[1]), 200)
    floor = step / (step + mb / args.bus_gbps)  # MB / (GB/s) is ms
    ax.plot(step, floor, "k--", label=f"bus floor: {mb:.0f} MB a token at {args.bus_gbps:g} GB/s")
    if args.goal:
        ax.axhline(args.goal, color="gray", lw=0.8, label=f"goal {args.goal:g}x")
    ax.set_xlabel("mlx-lm's median step, ms")
    ax.set_ylabel("step ratio, mlx-lm / streamer")
    ax.set_ylim(0, 1.2)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
