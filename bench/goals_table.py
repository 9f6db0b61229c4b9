"""Issue 35's goals table from bench/cuda_goals.sh's worker JSONs: per routing profile, mlx-lm
resident beside the slot path at each way and budget; steady decode (after each prompt's first 64
tokens), its ratio to mlx-lm's and its median step (steadier than a rate on a noisy machine: a
settle's token moves the mean, not the median), the cold start apart, slot hits, peak RssFile,
and whether each run's tokens are mlx-lm's (the same routing and greedy sampling: they must be,
to the bit).

    python bench/goals_table.py OUT/*.json [--markdown]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

GIB = 1 << 30


def rates(runs: list[dict], phase: str) -> list[float]:
    return [r[phase]["decode_tok_s"] for r in runs if phase in r]


def median_steps_ms(runs: list[dict]) -> list[float]:
    return [
        1000 * r["steady"]["median_step_s"] for r in runs if "median_step_s" in r.get("steady", {})
    ]


def hits(runs: list[dict]) -> float | None:
    decode = [r["steady"].get("decode") for r in runs if "steady" in r]
    hit = sum(d["cache_hits"] for d in decode if d)
    routed = hit + sum(d["experts_read"] for d in decode if d)
    return hit / routed if routed else None


def prefill(runs: list[dict]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in runs:
        out.setdefault(r["prompt_tokens"], []).append(r["prompt_tokens"] / r["ttft_s"])
    return out


def same(runs: list[dict], base: dict | None) -> str:
    """Whether every run made the tokens of mlx-lm's run of the same prompt ("-": not known)."""
    mine = [r.get("tokens_sha1") for r in runs]
    theirs = [r.get("tokens_sha1") for r in base["runs"]] if base else []
    if base is None or None in mine or None in theirs or len(mine) != len(theirs):
        return "-"
    return "same as mlx-lm" if mine == theirs else "DIFFER"


def span(values: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values) if values else "-"


def base_tag(tag: str) -> str:
    """The mlx-lm run that `tag` is rated against: its profile's, in its round when it has one
    (`bash bench/cuda_goals.sh rounds`: tags end in -rN)."""
    round_ = re.search(r"-r\d+$", tag)
    return tag.split("-")[0] + "-mlx_lm" + (round_.group() if round_ else "")


def rows(results: dict[str, dict]) -> list[str]:
    lines = [
        "| run | steady tok/s | ratio | median step ms | cold tok/s | hits | RssFile GiB "
        "| prefill tok/s | tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tag, result in sorted(results.items()):
        runs = result["runs"]
        base = results.get(base_tag(tag))
        ratio = "-"
        mine_base = base is result  # mlx-lm's own row: no ratio
        if not mine_base and base and rates(runs, "steady") and rates(base["runs"], "steady"):
            mine, theirs = rates(runs, "steady"), rates(base["runs"], "steady")
            ratio = f"{min(mine) / max(theirs):.2f}-{max(mine) / min(theirs):.2f}"
        h = hits(runs)
        rss = (result.get("peak_rss_file_bytes") or 0) / GIB
        fill = ", ".join(f"{n}: {span(v)}" for n, v in prefill(runs).items())
        lines.append(
            f"| {tag} | {span(rates(runs, 'steady'))} | {ratio} | {span(median_steps_ms(runs))} | "
            f"{span(rates(runs, 'cold'))} | "
            f"{'-' if h is None else f'{h:.1%}'} | {rss:.2f} | {fill} | {same(runs, base)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path)
    args = ap.parse_args(argv)
    results = {}
    for path in args.results:
        try:
            results[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"{path}: skipped ({e})")
    print("\n".join(rows(results)))


if __name__ == "__main__":
    main()
