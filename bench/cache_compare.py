#!/usr/bin/env python3
"""Slot pool vs in place vs mlx-lm resident, across memory budgets, warm / cold / squeezed, in one
run: decode tok/s and hit rates side by side (bench/README.md, "Slot pool vs in place").

    python bench/cache_compare.py --data /work/bench-data --dtype float32 \\
        --budgets 0,0.1,0.3 --available 3.5G --bypass 0.3

Budgets are fractions of all expert bytes (0: the slot pool holds one token's experts, in place
streams through the page cache). For each regime every engine runs in its own worker process:
warm (expert files read into the page cache first), cold (dropped before each run and again after
the first token), squeezed (a balloon leaves `--available` bytes for the run and the page cache).
In place at a budget above 0 is the mapped path with its hot-expert cache; the slot pool at 0 holds
one layer's experts. `--bypass 0.3` adds the slot pool reading around the page cache (O_DIRECT)
at those squeezed budgets. Writes
bench/results/<model>-cache-compare.json and, with matplotlib, the plot beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pagecache
from balloon import Balloon, GiB, mem_available
from engines import BENCH, log, worker
from models import ensure_models
from presets import ROUTING
from run import size
from summary import summarize

ENGINES = ("slots", "mapped")


def hit_rate(summary: dict, engine: str) -> float | None:
    """Slots: routed experts found in the pool. In place: routed bytes found in the page cache
    (with a hot-expert cache, hits there count as found)."""
    if summary.get("experts_read_per_token") is None:
        return None
    hits, reads = summary["cache_hits_per_token"], summary["experts_read_per_token"]
    if engine == "slots":
        return hits / (hits + reads) if hits + reads else None
    page = summary.get("page_cache_hit_rate")
    return None if page is None else (hits + reads * page) / (hits + reads)


def point(models, args, engine: str, budget: float, regime: str, bypass: bool = False) -> dict:
    expert_bytes = models.info["expert_bytes"]
    flags = [
        "--prompt-tokens", str(args.prompt_tokens), "--decode-tokens", str(args.decode_tokens),
        "--repeats", str(args.repeats), "--temp", "1.0",
    ]  # fmt: skip
    if engine == "mlx_lm":
        pagecache.warm(models.checkpoint_files)
        result = worker("mlx_lm", models, *flags, "--warmup")
    else:
        flags += ["--read-path", engine, "--memory-budget", str(int(budget * expert_bytes))]
        flags += ["--bypass-page-cache"] if bypass else []
        if regime == "warm":
            pagecache.warm(models.expert_files)
            flags.append("--warmup")
        else:
            pagecache.drop(models.expert_files)
            flags += ["--cold-decode"] if regime == "cold" else ["--warmup"]
        result = worker("streamer", models, *flags)
    summary = summarize([result], models, None)
    runs = result["runs"]
    if runs[0]["traffic"] is not None:
        steps = summary["decode_steps"]
        summary["cache_hits_per_token"] = sum(r["traffic"]["decode"]["cache_hits"] for r in runs)
        summary["cache_hits_per_token"] /= steps
    row = {
        "engine": engine if not bypass else f"{engine}-bypass",
        "budget_fraction": budget,
        "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs),
        "hit_rate": hit_rate(summary, engine) if engine != "mlx_lm" else 1.0,
        "summary": summary,
    }
    log(
        f"[compare] {regime} {row['engine']} budget {budget:.0%}: {row['decode_tok_s']:.2f} tok/s, "
        f"hit rate {row['hit_rate'] if row['hit_rate'] is None else round(row['hit_rate'], 3)}"
    )
    return row


def regime_rows(models, args, regime: str) -> list[dict]:
    rows = []
    if regime == "warm":
        rows.append(point(models, args, "mlx_lm", 1.0, regime))
    for engine in ENGINES:
        for budget in args.budgets:
            rows.append(point(models, args, engine, budget, regime))
    if regime == "squeezed":
        for budget in args.bypass:
            rows.append(point(models, args, "slots", budget, regime, bypass=True))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3-30b-a3b-12l")
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "streamer-bench")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"])
    ap.add_argument("--budgets", default="0,0.1,0.3", help="fractions of all expert bytes")
    ap.add_argument("--regimes", default="warm,cold,squeezed")
    ap.add_argument("--available", type=size, default=4 * GiB, help="squeezed: memory left")
    ap.add_argument("--bypass", default="", help="squeezed: also slots with O_DIRECT at these")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--reserve", type=size, default=2 * GiB)
    args = ap.parse_args()
    args.budgets = [float(b) for b in args.budgets.split(",")]
    args.bypass = [float(b) for b in args.bypass.split(",") if b]
    models = ensure_models(
        args.preset, args.data, layers=None, vocab=None, routing=ROUTING, seed=0, dtype=args.dtype
    )
    result = {"model": models.info, "args": {k: str(v) for k, v in vars(args).items()}}
    for regime in args.regimes.split(","):
        if regime != "squeezed":
            result[regime] = regime_rows(models, args, regime)
            continue
        floor = args.reserve + models.streamer_need
        with Balloon(max(mem_available() - args.available, 0), reserve=floor) as balloon:
            result["squeezed_available"] = mem_available()
            result[regime] = regime_rows(models, args, regime)
            result["balloon_survived"] = balloon.alive()
    name = models.name + "-cache-compare"
    out = BENCH / "results" / f"{name}.json"
    out.write_text(json.dumps(result, indent=1, default=str))
    log(f"[compare] wrote {out}")
    try:
        plot(result, BENCH / "results" / f"{name}.png")
    except ImportError:
        log("[compare] no matplotlib: no plot (pip install -e '.[bench]')")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = [r for r in ("warm", "cold", "squeezed") if r in result]
    fig, axes = plt.subplots(2, len(regimes), figsize=(4.5 * len(regimes), 7), squeeze=False)
    for col, regime in enumerate(regimes):
        rows = result[regime]
        for engine in sorted({r["engine"] for r in rows} - {"mlx_lm"}):
            mine = [r for r in rows if r["engine"] == engine]
            x = [100 * r["budget_fraction"] for r in mine]
            axes[0][col].plot(x, [r["decode_tok_s"] for r in mine], "o-", label=engine)
            axes[1][col].plot(x, [100 * (r["hit_rate"] or 0) for r in mine], "o-", label=engine)
        for r in rows:
            if r["engine"] == "mlx_lm":
                axes[0][col].axhline(r["decode_tok_s"], color="k", ls="--", label="mlx-lm resident")
        axes[0][col].set_title(regime)
        axes[0][col].set_ylabel("decode tok/s")
        axes[1][col].set_ylabel("hit rate %")
        axes[1][col].set_xlabel("memory budget, % of expert bytes")
        axes[0][col].legend(fontsize=8)
    fig.suptitle(f"{result['model']['name']}: slot pool vs in place vs mlx-lm resident")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
