"""Issue 35's bench scripts on the CPU: bench/goals_table.py, bench/settle_copies.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def bench_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # bench/ is a folder of scripts, not a package


def run(
    steady: float, cold: float, hits: int = 0, read: int = 0, prompt: int = 16, made: str = "a"
) -> dict:
    decode = {"cache_hits": hits, "experts_read": read}
    return {
        "tokens_sha1": made,
        "prompt_tokens": prompt,
        "ttft_s": prompt / 100,
        "cold": {"decode_tok_s": cold},
        "steady": {
            "decode_tok_s": steady,
            "median_step_s": 1 / (steady + 2),  # a settle's token slows the mean, not the median
            "decode": decode if hits or read else None,
        },
    }


def test_the_table_rates_each_run_against_its_profiles_mlx_lm(bench_path, tmp_path, capsys):
    from goals_table import main

    results = {
        "medium-mlx_lm": {"runs": [run(60, 50), run(50, 45)], "peak_rss_file_bytes": 1 << 29},
        "medium-staged-25": {
            "runs": [run(40, 20, hits=90, read=10), run(45, 25, hits=80, read=20)],
            "peak_rss_file_bytes": 3 << 29,
        },
        "medium-gathered-25": {"runs": [run(40, 20), run(45, 25, made="b")]},
        "medium-mlx_lm-r2": {"runs": [run(80, 50), run(100, 45)]},  # rounds: each its own
        "medium-gathered-25-now-r2": {"runs": [run(40, 20), run(50, 25)]},
        "broken": None,
    }
    paths = []
    for tag, result in results.items():
        paths.append(tmp_path / f"{tag}.json")
        paths[-1].write_text("" if result is None else json.dumps(result))
    main([str(p) for p in paths])
    out = capsys.readouterr().out
    assert "broken.json: skipped" in out
    row = next(line for line in out.splitlines() if line.startswith("| medium-staged-25 "))
    # steady rates, worst/best against mlx-lm's best/worst, median steps, cold, hits 170/200,
    # RssFile, prefill
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:4] == ["medium-staged-25", "40.0/45.0", "0.67-0.90", "23.8/21.3"]
    assert cells[4:] == ["20.0/25.0", "85.0%", "1.50"] + [
        "16: 100.0/100.0",
        "same as mlx-lm",
    ]
    row = next(line for line in out.splitlines() if line.startswith("| medium-gathered-25 "))
    assert row.strip(" |").endswith("| DIFFER")  # its second prompt made other tokens
    row = next(line for line in out.splitlines() if line.startswith("| medium-gathered-25-now-r2"))
    assert row.split("|")[3].strip() == "0.40-0.62"  # against round 2's mlx-lm: 40/100, 50/80


def test_settle_copies_counts_what_a_gathered_pool_copies(bench_path, capsys):
    """bench/settle_copies.py: with every expert's slot a settle copies each routed expert once
    (nothing is evicted); with less, misses fall as the pool grows, and the settle's refresh
    copies fewer than giving each call's misses slots (`--by-calls`)."""
    from routing_model import RoutingModel
    from settle_copies import main

    common = ["--experts", "16", "--top-k", "2", "--layers", "4", "--tokens", "60", "--json"]
    main(["--profiles", "uniform", "--budgets", "1.0", "--prompts", "1", *common])
    (full,) = json.loads(capsys.readouterr().out)["rows"]
    trace = RoutingModel("uniform", 16, 2, 4).prompt(0, 60)
    distinct = sum(len(np.unique(trace[:, layer])) for layer in range(4))
    assert round(full["copies"] * 60) == distinct and full["misses"] * 60 >= distinct
    rows = {}
    for by_calls in ([], ["--by-calls"]):
        main(["--profiles", "uniform", "--budgets", "0.25,0.5", *by_calls, *common])
        rows[bool(by_calls)] = json.loads(capsys.readouterr().out)["rows"]
    assert rows[False][0]["misses"] > rows[False][1]["misses"]
    assert all(r["copies"] < c["copies"] for r, c in zip(rows[False], rows[True]))


def test_settle_copies_recent_counts_the_previous_tokens_experts_as_hits(bench_path):
    """`--recent`: a layer's previous token's experts are hits beside the pool. A trace that
    routes each expert pair twice in a row misses the second call too without it (a pool of two
    slots settled only every 16 tokens), and only a pair's first with it."""
    from settle_copies import pool_run

    from streamer.cache.settle import replay

    pairs = [[2 * i % 16, (2 * i + 1) % 16] for i in range(16)]
    trace = np.array([[pair] for pair in pairs for _ in range(2)])  # [32 tokens, 1 layer, 2]
    plain = pool_run([trace], 0, 1, 2, 16, 16, replay)[0]
    recent = pool_run([trace], 0, 1, 2, 16, 16, replay, recent=True)[0]
    assert recent <= 2 * len(pairs) < plain  # with it, only a pair's first call can miss


def test_settle_plot_draws_the_committed_comparison(bench_path, tmp_path, capsys):
    """bench/settle_plot.py draws bus bytes per token for the three settles from the committed
    bench/settle_copies.py results."""
    from settle_plot import main

    main([str(tmp_path / "settle.png")])
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "settle.png").stat().st_size > 10_000


def test_host_cost_times_a_gathered_call_with_its_kernel_stood_in(
    bench_path, checkpoints, monkeypatch
):
    """bench/host_cost.py --gathered: CUDA's gathered calls on this CPU, their kernel stood in
    for by MLX's gathers: no sync, every call deferred to the pool (hits counted at its settles),
    and the engine's host time beside mlx-lm's container on the same inputs."""
    from host_cost import main

    from streamer.cache.slot_pool import SlotPool

    monkeypatch.setattr(SlotPool, "gather_source", SlotPool.gather_source)  # main replaces it
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe", dtype="float32"))
    result = main([str(folder), "--gathered", "--calls", "40"])  # a pool of a quarter
    assert result["gathered"] and result["sync_us"] == 0 and result["warm_sync_us"] == 0
    assert result["hits_per_call"] > 0  # the pool settled the calls' routings and held them
    assert result["engine_us"] > 0 and result["container_us"] > 0
    assert result["engine_ops"]["python_calls"] > result["container_ops"]["python_calls"]
