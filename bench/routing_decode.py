#!/usr/bin/env python3
"""Decode under the routing model's profiles, side by side in one run: streamer's slot pool (its
LFU with aging and LRU) at shares of the experts and its mapped path, against mlx-lm resident,
every engine routed alike (bench/worker.py --routing: the same experts at the same positions).

    python bench/routing_decode.py [--preset narrow --layers 8] [--profiles high,uniform]
        [--shares 0.125,0.25,0.5] [--repeats 2 --decode-tokens 160]

Each run is a prompt of its own (a new working set); the first 64 decode tokens are its cold
start, the rest its steady state. Writes bench/results/routing-decode-<model>.json and prints a
table of median-step rates (a loaded machine's spikes left out). On a shared CPU compare ratios
within a run, not tok/s across runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engines import BENCH, log, worker
from models import ensure_models
from presets import ROUTING

POLICIES = ("lfu", "lru")


def engines(
    shares: list[float], expert_bytes: int, policies: list[str]
) -> list[tuple[str, str, list[str]]]:
    """(label, engine, worker arguments) of each engine a profile is run on."""
    out = [("mlx-lm resident", "mlx_lm", []), ("mapped", "streamer", ["--read-path", "mapped"])]
    for share in shares:
        budget = ["--read-path", "slots", "--memory-budget", str(int(share * expert_bytes))]
        for policy in policies:
            out.append(
                (f"slots {share:g} {policy}", "streamer", [*budget, "--pool-policy", policy])
            )
    return out


def summary(result: dict) -> dict:
    """Decode rates over all runs (tokens over seconds), cold and steady apart, and the slot hits
    and bytes read per token in each."""
    out = {}
    for part in ("cold", "steady"):
        phases = [run[part] for run in result["runs"] if part in run]
        tokens = sum(p["decode_tokens"] for p in phases)
        seconds = sum(p["decode_tokens"] / p["decode_tok_s"] for p in phases)
        out[f"{part}_tok_s"] = tokens / seconds if seconds else None
        # per run the median step, the rate a machine shared with other jobs gives most steadily
        out[f"{part}_median_tok_s"] = len(phases) / sum(p["median_step_s"] for p in phases)
        traffic = [p["decode"] for p in phases if "decode" in p]
        if traffic:
            hits = sum(t["cache_hits"] for t in traffic)
            routed = hits + sum(t["experts_read"] for t in traffic)
            out[f"{part}_hits"] = hits / routed if routed else None
            out[f"{part}_read_per_token"] = sum(t["bytes_read"] for t in traffic) / tokens
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="narrow")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "streamer-bench")
    ap.add_argument("--profiles", default="high,medium,low,uniform")
    ap.add_argument("--shares", default="0.125,0.25,0.5")
    ap.add_argument("--repeats", type=int, default=2, help="prompts per engine")
    ap.add_argument("--decode-tokens", type=int, default=160)
    ap.add_argument("--policies", default=",".join(POLICIES), help="the slot pool's policies")
    ap.add_argument("--results", type=Path, default=BENCH / "results")
    ap.add_argument("--tag", help="appended to the result file's name")
    args = ap.parse_args()
    models = ensure_models(
        args.preset, args.data, layers=args.layers, vocab=None, routing=ROUTING, seed=0
    )
    shares = [float(s) for s in args.shares.split(",")]
    common = ["--prompt-tokens", "16", "--decode-tokens", str(args.decode_tokens)]
    common += ["--repeats", str(args.repeats), "--warmup"]
    rows = []
    for profile in args.profiles.split(","):
        base = None
        policies = args.policies.split(",")
        for label, engine, extra in engines(shares, models.info["expert_bytes"], policies):
            log(f"[routing] {profile}: {label}")
            result = worker(engine, models, *common, "--routing", profile, *extra)
            row = {"profile": profile, "engine": label, **summary(result)}
            base = base or row
            for part in ("cold", "steady"):
                row[f"{part}_ratio"] = row[f"{part}_median_tok_s"] / base[f"{part}_median_tok_s"]
            rows.append(row)
            log(json.dumps(row))
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"routing-decode-{models.name}{f'-{args.tag}' if args.tag else ''}.json"
    out.write_text(
        json.dumps(
            {"model": models.info, "settings": vars(args), "rows": rows}, default=str, indent=1
        )
    )
    print(table(rows))


def table(rows: list[dict]) -> str:
    lines = [
        "| profile | engine | cold tok/s (x resident) | steady (x resident) | hits cold/steady |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        hits = (
            f"{r['cold_hits']:.0%} / {r['steady_hits']:.0%}"
            if r["engine"].startswith("slots")
            else ""
        )
        lines.append(
            f"| {r['profile']} | {r['engine']} | {r['cold_median_tok_s']:.1f} "
            f"({r['cold_ratio']:.2f}x) | {r['steady_median_tok_s']:.1f} ({r['steady_ratio']:.2f}x) "
            f"| {hits} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
