#!/usr/bin/env python3
"""Prefill on the slot path at a budget against every expert resident, side by side in one run.

    python bench/prefill_budget.py MODEL --budgets 1,0.25 --lengths 64,2048 --rounds 2

MODEL is a repacked folder. Each (budget, round) loads the model once in its own process: 1 is
every expert resident (the slot path's resident pools, mlx-lm's graph), below 1.0 a slot pool of
that share of the expert bytes, page cache warm. For each prompt length, one prefill (a whole
forward pass of the prompt in chunks of PREFILL_STEP tokens, as mlx_lm.generate_step does, then
evaluated) after a short untimed one; printed: prompt tok/s by the wall clock and by the process's
CPU time (less inflated by the other users of a shared machine), the engine's expert reads and their
time, and each budget's ratio to resident (when 1 is among the budgets) from the same round. Writes
bench/results/<model>-prefill-budget.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from engines import child_result, log  # noqa: E402

PREFILL_STEP = 2048  # mlx_lm.generate_step's default prefill_step_size


def prefill(model, ids) -> tuple[float, float]:
    """Wall and CPU seconds of one prompt's forward pass in chunks, with a fresh cache."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    start, cpu = time.perf_counter(), time.process_time()
    for lo in range(0, ids.size, PREFILL_STEP):
        mx.eval(model(ids[None, lo : lo + PREFILL_STEP], cache=cache))
    return time.perf_counter() - start, time.process_time() - cpu


def one(args: argparse.Namespace) -> dict:
    import pagecache
    from worker import prompt_ids

    import streamer

    pagecache.warm(sorted((args.model / "experts").iterdir()))
    model, _ = streamer.load(args.model, memory_budget=args.bytes, read_path="slots")
    stats = model.streamer.stats
    prefill(model, prompt_ids(8, seed=99))
    rows = []
    for n in args.lengths:
        stats.reset()
        seconds, cpu = prefill(model, prompt_ids(n))
        traffic = stats.prefill
        rows.append(
            {
                "prompt_tokens": n,
                "seconds": seconds,
                "tok_s": n / seconds,
                "cpu_s_per_token": cpu / n,
                "experts_read": traffic.experts_read,
                "read_seconds": traffic.read_seconds,
            }
        )
        log(
            f"[prefill] {args.fraction}: {n} tokens at {n / seconds:.2f} tok/s, "
            f"{cpu / n:.3f} CPU s each"
        )
    return {"fraction": args.fraction, "residency": model.streamer.residency, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="a repacked folder")
    ap.add_argument("--budgets", default="1,0.25", help="shares of the expert bytes (1: resident)")
    ap.add_argument("--lengths", default="64,2048")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--fraction", type=float, help=argparse.SUPPRESS)  # a child's budget
    args = ap.parse_args()
    args.lengths = [int(n) for n in args.lengths.split(",")]
    if args.fraction is not None:
        from streamer.io.manifest import read_manifest

        expert_bytes = read_manifest(args.model).expert_file_bytes
        args.bytes = int(args.fraction * expert_bytes) if args.fraction < 1 else 1 << 50
        print(json.dumps(one(args)))
        return
    fractions = [float(b) for b in args.budgets.split(",")]
    runs = []
    for _ in range(args.rounds):
        runs.append({f: child(args, f) for f in fractions})
    summary = {}
    for f in [f for f in fractions if f != 1.0] if 1.0 in fractions else []:
        for i, n in enumerate(args.lengths):
            rows = [(r[f]["rows"][i], r[1.0]["rows"][i]) for r in runs]
            ratios = [mine["tok_s"] / resident["tok_s"] for mine, resident in rows]
            cpu = [resident["cpu_s_per_token"] / mine["cpu_s_per_token"] for mine, resident in rows]
            summary[f"{f} x {n}"] = {"ratios": ratios, "cpu_ratios": cpu}
            log(f"[prefill] {f:.0%} of the experts, {n} tokens: {ratios} of resident (CPU: {cpu})")
    out = BENCH / "results" / f"{args.model.name.rsplit('-', 2)[0]}-prefill-budget.json"
    out.write_text(json.dumps({"lengths": args.lengths, "runs": runs, "summary": summary}))
    log(f"[prefill] wrote {out}")


def child(args: argparse.Namespace, fraction: float) -> dict:
    argv = [sys.executable, __file__, str(args.model), "--fraction", str(fraction)]
    argv += ["--lengths", ",".join(map(str, args.lengths))]
    return {str(k): v for k, v in child_result(argv, f"[prefill] the {fraction} point").items()}


if __name__ == "__main__":
    main()
