#!/usr/bin/env python3
"""Streamer's decode step against the bytes a token moves over the bus, and the line through them.

    python bench/step_bytes_plot.py OUT.png PAIRED.json... [--goal 0.8]

Each point is one pair of bench/paired.py: the bytes streamer's token moved over the bus (misses
read, settles' copies: `bus_mb_per_token`) and its median step. Runs of several profiles or
budgets on one machine spread the bytes, and a least-squares line through all the pairs splits
the step into a part that does not move with the bytes (its intercept) and a rate: what one
more megabyte a token costs within a token's layers (its slope, as GB/s). That rate, not a lone
kernel's, is the one a bus floor needs. With `--goal R`, the step that goal allows beside
mlx-lm's median step (theirs / R) is drawn, and the bytes a token the line allows there are
printed: what a cache would have to bring the misses down to. Give one engine's runs of one
machine: the line means nothing across machines. Needs matplotlib (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def fit(mb: np.ndarray, step_ms: np.ndarray) -> tuple[float, float]:
    """The line step = intercept + mb / rate: (intercept ms, rate GB/s)."""
    if np.ptp(mb) == 0:
        raise SystemExit("every pair moved the same bytes: give runs of other profiles or budgets")
    slope, intercept = np.polyfit(mb, step_ms, 1)
    return float(intercept), float(1 / slope)  # MB / (GB/s) is ms


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the PNG to write")
    ap.add_argument("runs", type=Path, nargs="+", help="bench/paired.py's JSON outputs")
    ap.add_argument("--goal", type=float, help="a goal's ratio to mlx-lm: the bytes it allows")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    mb, ours, theirs = [], [], []
    for run in args.runs:
        pairs = json.loads(run.read_text(encoding="utf-8"))["pairs"]
        x = [p["bus_mb_per_token"] for p in pairs]
        ax.scatter(x, [p["streamer_step_ms"] for p in pairs], label=run.stem, s=18)
        mb += x
        ours += [p["streamer_step_ms"] for p in pairs]
        theirs += [p["mlx_lm_step_ms"] for p in pairs]
    intercept, rate = fit(np.array(mb), np.array(ours))
    result = {"intercept_ms": intercept, "marginal_gbps": rate, "mlx_lm_step_ms": np.median(theirs)}
    line = np.linspace(0, max(mb) * 1.1, 100)
    ax.plot(
        line, intercept + line / rate, "k--", label=f"{intercept:.1f} ms + MB / {rate:.1f} GB/s"
    )
    ax.axhline(result["mlx_lm_step_ms"], color="gray", lw=0.8, label="mlx-lm's median step")
    if args.goal:
        allowed = result["mlx_lm_step_ms"] / args.goal
        result["goal_mb_per_token"] = (allowed - intercept) * rate
        ax.axhline(allowed, color="tab:red", lw=0.8, label=f"goal {args.goal:g}x")
    ax.set_xlabel("bytes over the bus a token, MB")
    ax.set_ylabel("streamer's median step, ms")
    ax.set_xlim(0)
    ax.set_ylim(0)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(json.dumps({k: round(float(v), 2) for k, v in result.items()}))
    return result


if __name__ == "__main__":
    main()
