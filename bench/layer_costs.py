"""Where a decoded token's time goes, per MoE layer call, from bench/worker.py results.

    python bench/layer_costs.py RESULT.json [RESULT.json ...]

For each worker result (one engine at one budget) and each of its runs: decode tok/s, slot hits,
bytes read per token and at what rate (`read_gb_s` over `place`'s time in every synced call,
`miss_gb_s` over the calls that read a miss only: the rest is the fence and LFU), and per layer
call: the wait on the routing sync (the GPU
finishing the queued work: earlier experts, this layer's attention and router), the misses'
reads, the rest of the layer's host time (routing on the host, placing, building the expert
graph), and the host time outside the expert layers (the model's other Python and graph building,
mlx-lm's generation loop), all in ms; with `worker.py --profile`, also the expert compute that an
extra sync per layer measures (that run's other figures then include the extra syncs). mlx-lm's
resident run has no layer figures: its ms per token over the MoE layers is the compute a layer
costs when nothing waits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(result: dict) -> list[dict]:
    out = []
    for run in result["runs"]:
        tokens, seconds = run["decode_tokens"], run["decode_s"]
        row = {"tok_s": tokens / seconds, "ms_token": 1e3 * seconds / tokens}
        traffic = run.get("traffic")
        if traffic:
            d, calls = traffic["decode"], traffic["decode"]["layer_calls"]
            routed = d["cache_hits"] + d["experts_read"]
            per = 1e3 / max(calls, 1)
            row.update(
                hits=d["cache_hits"] / routed if routed else None,
                read_mb_token=d["bytes_read"] / tokens / 1e6,
                read_gb_s=d["bytes_read"] / d["read_seconds"] / 1e9 if d["read_seconds"] else None,
                miss_gb_s=d["bytes_read"] / d["miss_seconds"] / 1e9  # calls that missed only
                if d.get("miss_seconds")
                else None,
                syncs_token=d["syncs"] / tokens,
                sync_ms=d["sync_seconds"] * per,
                read_ms=d["read_seconds"] * per,
                layer_host_ms=(d["layer_seconds"] - d["sync_seconds"] - d["read_seconds"]) * per,
                outside_ms=(seconds - d["layer_seconds"]) * per,
                kernel_ms=d["compute_seconds"] * per or None,  # worker.py --profile only
            )
        out.append(row)
    return out


def cell(value, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def main(paths: list[str]) -> None:
    columns = ("tok_s", "ms_token", "hits", "read_mb_token", "read_gb_s", "miss_gb_s")
    columns += ("syncs_token",)
    columns += ("sync_ms", "read_ms", "layer_host_ms", "outside_ms", "kernel_ms")
    print("| result | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for path in paths:
        for row in rows(json.loads(Path(path).read_text())):
            print(f"| {Path(path).stem} | " + " | ".join(cell(row.get(c)) for c in columns) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
