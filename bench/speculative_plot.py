"""Speculative decoding's results (bench/speculative.py): the plot and the tables for the README.

    python bench/speculative_plot.py [RESULTS_JSON]   # writes bench/results/speculative.png and
                                                      # prints the markdown tables

The plot needs matplotlib (`pip install -e ".[bench]"`; without it, the tables alone). The x axis
is the measured acceptance (drafts kept / drafts checked), on which the real drafters' runs are
marked; one line of decode tok/s per regime, its plain decode dashed, and a star for prompt lookup
measured on the regime's own model (`--prompt-lookup`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "speculative.json"
COLOURS = ["tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple"]


def break_even(curve: dict) -> float | None:
    """The acceptance where drafting starts to pay (tok/s reaches plain's), interpolated between
    the measured rates; 0 when it pays even with none kept, None when it never does."""
    plain = curve["plain"]["decode_tok_s"]
    points = [(row["acceptance"] or 0.0, row["decode_tok_s"] / plain) for row in curve["oracle"]]
    points.sort()
    if points[0][1] >= 1:
        return 0.0
    for (a0, s0), (a1, s1) in zip(points, points[1:]):
        if s0 < 1 <= s1:
            return a0 + (1 - s0) * (a1 - a0) / (s1 - s0)
    return None


def speedup_at(curve: dict, acceptance: float) -> float:
    """Speedup over plain at `acceptance`, interpolated on the oracle's measured points."""
    plain = curve["plain"]["decode_tok_s"]
    points = sorted(
        (row["acceptance"] or 0.0, row["decode_tok_s"] / plain) for row in curve["oracle"]
    )
    for (a0, s0), (a1, s1) in zip(points, points[1:]):
        if a0 <= acceptance <= a1:
            return s0 + (acceptance - a0) * (s1 - s0) / (a1 - a0 or 1)
    return points[-1][1] if acceptance > points[-1][0] else points[0][1]


def tables(result: dict) -> str:
    k = result["settings"]["k"]
    lines = [
        "| regime | draft rate | kept | tokens/pass | tok/s | vs plain | expert MB/token | "
        "syncs/token | wasted MB/token |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for curve in result["curves"]:
        plain = curve["plain"]
        lines.append(
            f"| {curve['regime']} | plain | | 1 | {plain['decode_tok_s']:.2f} | 1.00 | "
            f"{plain['expert_mb_per_token']:.1f} | {plain['syncs_per_token']:.1f} | |"
        )
        for row in curve["oracle"] + curve.get("drafters", []):
            lines.append(
                f"| | {row.get('drafter') or format(row['rate'], '.2f')} "
                f"| {row['acceptance'] or 0:.0%} | {row['tokens_per_pass']:.2f} "
                f"| {row['decode_tok_s']:.2f} | {row['decode_tok_s'] / plain['decode_tok_s']:.2f} "
                f"| {row['expert_mb_per_token']:.1f} | {row['syncs_per_token']:.2f} "
                f"| {row['wasted_mb_per_token']:.1f} |"
            )
    for curve in result["curves"]:
        truth = curve["plain"].get("oracle_truth", "plain")
        if truth != "plain":  # a GPU: a pass's greedy tokens left plain decoding's
            lines.append(f"\n{curve['regime']}: the oracle drafted {truth} (not plain decoding's).")
    lines += ["", f"| regime | break-even acceptance (k={k}) |", "|---|---|"]
    for curve in result["curves"]:
        even = break_even(curve)
        shown = "never, in the measured range" if even is None else f"{even:.0%}"
        lines.append(f"| {curve['regime']} | {shown} |")
    checks = [c for c in result["curves"] if "pass_against_steps" in c]
    if checks:
        lines += [
            "",
            "| regime | one pass against single steps: max abs logit diff | argmax agree |",
        ]
        lines.append("|---|---|---|")
    for curve in checks:
        check = curve["pass_against_steps"]
        lines.append(
            f"| {curve['regime']} | {check['max_abs_logit_diff']:.3g} | "
            f"{check['argmax_agree']} of {check['rows']} |"
        )
    if not result["acceptance"]:
        return "\n".join(lines)
    lines += [
        "",
        "| drafter | text | kept | tokens/pass | "
        + " | ".join(f"speedup {c['regime']}" for c in result["curves"])
        + " |",
        "|---|---|---|---|" + "---|" * len(result["curves"]),
    ]
    for row in result["acceptance"]:
        kept = row["acceptance"] or 0.0
        speedups = " | ".join(f"{speedup_at(c, kept):.2f}" for c in result["curves"])
        lines.append(
            f"| {row['drafter']} | {row['text']} | {kept:.0%} | {row['tokens_per_pass']:.2f} "
            f"| {speedups} |"
        )
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for colour, curve in zip(COLOURS, result["curves"]):
        rows = sorted(curve["oracle"], key=lambda r: r["acceptance"] or 0.0)
        xs = [r["acceptance"] or 0.0 for r in rows]
        ax.plot(
            xs,
            [r["decode_tok_s"] for r in rows],
            color=colour,
            marker="o",
            label=f"{curve['regime']}: oracle drafts",
        )
        ax.axhline(curve["plain"]["decode_tok_s"], color=colour, linestyle="--", linewidth=0.8)
        for row in curve.get("drafters", []):  # measured on this curve's model: a star
            ax.plot(row["acceptance"] or 0.0, row["decode_tok_s"], "*", color=colour, ms=10)
            ax.annotate(row["drafter"], (row["acceptance"] or 0.0, row["decode_tok_s"]), fontsize=7)
    for row in result["acceptance"]:
        kept = row["acceptance"] or 0.0
        ax.axvline(kept, color="grey", linestyle=":", linewidth=0.8)
        ax.annotate(
            f"{row['drafter']}, {row['text']}",
            (kept, 0),
            rotation=90,
            fontsize=7,
            xytext=(2, 4),
            textcoords="offset points",
            va="bottom",
        )
    model, k = result["model"], result["settings"]["k"]
    ax.set_xlabel(f"acceptance (drafts kept / drafts checked), k={k} drafts per pass")
    ax.set_ylabel("decode tokens/s (dashed: plain decoding)")
    ax.set_title(
        f"speculative decoding: {model['layers']} layers x {model['num_experts']} experts, "
        f"top-{model['top_k']}; random weights, {_where(result['settings'])}",
        fontsize=9,
    )
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _where(settings: dict) -> str:
    """The backend and checkpoint dtype (results from before they were recorded: this CPU's)."""
    return f"{settings.get('device', 'cpu').upper()} {settings.get('checkpoint_dtype', 'float32')}"


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    result = json.loads(source.read_text())
    print(tables(result))
    try:
        plot(result, source.with_suffix(".png"))
    except ImportError:  # a GPU machine with no package index: the tables are what it pastes
        print("(no matplotlib: no plot; run this script on the JSON elsewhere for it)")


if __name__ == "__main__":
    main()
