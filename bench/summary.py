"""What the workers' outputs add up to: rates as median/min/max, traffic and time per token, the
headline numbers."""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from models import Models


def spread(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarize(results: list[dict], models: Models, disk_gbps: float | None) -> dict:
    """Aggregate one engine's worker outputs: rates as median/min/max over runs, traffic per
    step."""
    runs = [r for w in results for r in w["runs"]]
    decode_s = sum(r["decode_s"] for r in runs)
    decode_tokens = sum(r["decode_tokens"] for r in runs)
    ms_per_token = 1000 * decode_s / decode_tokens if decode_tokens else None
    out = {
        "decode_tok_s": spread([r["decode_tok_s"] for r in runs]),
        "ttft_s": spread([r["ttft_s"] for r in runs]),
        "ms_per_token": ms_per_token,  # mean over all decode tokens of all runs
        "tok_s_per_worker": [
            [round(r["decode_tok_s"] or 0, 4) for r in w["runs"]] for w in results
        ],
        "prompt_tokens": runs[0]["prompt_tokens"],
        "decode_tokens_per_run": runs[0]["decode_tokens"],
        "load_s": spread([w["load_s"] for w in results]),
        "peak_rss_bytes": max(w["peak_rss_bytes"] for w in results),
        "peak_rss_anon_bytes": max((w["peak_rss_anon_bytes"] or 0) for w in results) or None,
        "peak_rss_file_bytes": max((w["peak_rss_file_bytes"] or 0) for w in results) or None,
        "peak_mlx_bytes": max(w["peak_mlx_bytes"] for w in results),
        "mem_available_before": min(w["mem_available_before"] for w in results),
    }
    if runs[0]["traffic"] is None:
        return out
    decode = {k: sum(r["traffic"]["decode"][k] for r in runs) for k in runs[0]["traffic"]["decode"]}
    prefill = {
        k: sum(r["traffic"]["prefill"][k] for r in runs) for k in runs[0]["traffic"]["prefill"]
    }
    steps = decode["layer_calls"] / models.moe_layers  # one-token forward passes
    hit = (
        decode["bytes_in_page_cache"] / decode["bytes_measured"]
        if decode["bytes_measured"]
        else None
    )
    per_token = decode["bytes_read"] / steps
    out.update(
        decode_steps=steps,
        syncs_per_token=decode["syncs"] / steps,
        syncs_per_moe_layer=decode["syncs"] / decode["layer_calls"],
        bytes_read_per_token=per_token,
        experts_read_per_token=decode["experts_read"] / steps,
        experts_fetched_per_token=decode.get("experts_fetched", 0)
        / steps,  # cold: one WILLNEED each
        bytes_copied_per_token=decode["bytes_copied"] / steps,
        page_cache_hit_rate=hit,
        read_gbps=decode["bytes_read"] / decode["read_seconds"] / 1e9
        if decode["read_seconds"]
        else None,
        prefill_bytes_read_per_run=prefill["bytes_read"] / len(runs),
    )
    # Time split from the engine's timers: inside the expert layers, the routing sync (attention,
    # router and the previous layer's expert compute), reads, profiled compute, and the layer's own
    # overhead (Python, bookkeeping, graph building); `other` is everything outside the layers.
    ms = {
        k[: -len("_seconds")]: 1000 * v / steps for k, v in decode.items() if k.endswith("_seconds")
    }
    layer = ms.pop("layer", 0.0)
    split = {f"{k}_ms_per_token": v for k, v in ms.items()}
    split["layer_overhead_ms_per_token"] = layer - sum(ms.values())
    out["split"] = {**split, "other_ms_per_token": ms_per_token - layer if ms_per_token else None}
    if hit is not None and disk_gbps:
        miss = per_token * (1 - hit)
        out["miss_bytes_per_token"] = miss
        out["io_ms_per_token"] = 1000 * miss / (disk_gbps * 1e9)
        out["io_bound_tok_s"] = 1000 / out["io_ms_per_token"] if miss else None
    return out


def median(summary: dict | None, key: str = "decode_tok_s") -> float | None:
    return summary[key]["median"] if summary and summary.get(key) else None


def flat(result: dict) -> dict:
    """The headline numbers, at the top level of the result."""
    s, b = result.get("streamer"), result.get("mlx_lm")
    rate, base = median(s), median(b)
    return {
        "decode_tok_s": rate,
        "baseline_tok_s": base,
        "ratio": rate / base if rate and base else None,
        "ttft_s": median(s, "ttft_s"),
        "baseline_ttft_s": median(b, "ttft_s"),
        "bytes_read_per_token": s.get("bytes_read_per_token"),
        "bytes_copied_per_token": s.get("bytes_copied_per_token"),
        "syncs_per_token": s.get("syncs_per_token"),
        "syncs_per_moe_layer": s.get("syncs_per_moe_layer"),
        "page_cache_hit_rate": s.get("page_cache_hit_rate"),
        "io_bound_tok_s": s.get("io_bound_tok_s"),
        "peak_rss_bytes": s["peak_rss_bytes"],
        "peak_rss_anon_bytes": s.get("peak_rss_anon_bytes"),
        "baseline_peak_rss_bytes": b.get("peak_rss_bytes") if b else None,
    }


def headline(result: dict) -> str:
    if "decode_tok_s" not in result:
        return json.dumps(
            {k: v for k, v in result.items() if k in ("points", "lengths")}, indent=1, default=str
        )

    def fmt(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    return (
        f"[bench] {result['scenario']}: streamer {fmt(result['decode_tok_s'], '.2f')} tok/s, "
        f"mlx-lm {fmt(result['baseline_tok_s'], '.2f')} tok/s, "
        f"ratio {fmt(result['ratio'], '.2f')}; "
        f"{fmt(result['bytes_read_per_token'] / 1e6, '.1f')} MB/token, "
        f"syncs/token {fmt(result['syncs_per_token'], '.1f')}, "
        f"hit rate {fmt(result['page_cache_hit_rate'], '.0%')}, "
        f"I/O bound {fmt(result['io_bound_tok_s'], '.1f')} tok/s"
    )
