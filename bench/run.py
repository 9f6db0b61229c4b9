"""The benchmark: streamer's streamed decode vs mlx-lm's fully resident model, per scenario.

    python bench/run.py warm      [--preset qwen3-30b-a3b-12l] [--data DIR]   # page cache warm
    python bench/run.py cold      ...   # expert files dropped from the page cache before every run
    python bench/run.py squeezed  --available 6G,4G ...   # a balloon leaves only that much memory
    python bench/run.py prefill   --lengths 128,512,2048 ...   # time to first token
    python bench/run.py --quick --json   # a small model, warm, one JSON object on stdout

Checkpoints are generated (bench/generate_checkpoint.py) and repacked into DATA on first use and
reused after. Results go to RESULTS/<model>-<scenario>.json; bench/plot.py draws them.
See bench/README.md for what each number means.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pagecache
from balloon import Balloon, GiB, mem_available
from generate_checkpoint import (
    PRESETS,
    ROUTING,
    checkpoint_spec,
    preset_config,
    read_spec,
    write_checkpoint,
)

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SCENARIOS = ("warm", "cold", "squeezed", "prefill", "layouts")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- models --------------------------------------------------------------------------------------
class Models:
    """The MLX checkpoint (for mlx-lm) and its repacked folder (for streamer), plus their sizes."""

    def __init__(self, name: str, mlx: Path, streaming: Path):
        from streamer.io.manifest import RESIDENT_FILE, read_manifest

        self.name, self.mlx, self.streaming = name, mlx, streaming
        manifest = read_manifest(streaming)
        config = manifest.config
        self.expert_files = [streaming / layer.file for layer in manifest.layers]
        self.checkpoint_files = sorted(mlx.glob("model*.safetensors"))
        self.moe_layers = len(manifest.layers)
        self.record_bytes = manifest.layers[0].record_bytes
        self.info = {
            "name": name,
            "model_type": config["model_type"],
            "layers": config["num_hidden_layers"],
            "moe_layers": self.moe_layers,
            "num_experts": manifest.layers[0].num_experts,
            "top_k": config["num_experts_per_tok"],
            "hidden_size": config["hidden_size"],
            "moe_intermediate_size": config.get("moe_intermediate_size"),
            "vocab_size": config["vocab_size"],
            "quantization": {
                k: v for k, v in config["quantization"].items() if not isinstance(v, dict)
            },
            "record_bytes": self.record_bytes,
            "expert_bytes": manifest.expert_file_bytes,
            "resident_bytes": (streaming / RESIDENT_FILE).stat().st_size,
            "checkpoint_bytes": sum(p.stat().st_size for p in self.checkpoint_files),
            "active_expert_bytes_per_token": self.record_bytes
            * config["num_experts_per_tok"]
            * self.moe_layers,
            "routing": "synthetic (random weights; skew via router rows, reuse via topics)",
            "routing_params": read_spec(mlx)["routing"],
        }

    @property
    def streamer_need(self) -> int:
        """Memory a streamer run needs besides the page cache: resident weights (scales widen to
        float32) and working buffers. An estimate, used to refuse balloons that would starve it."""
        return 2 * self.info["resident_bytes"] + GiB

    @property
    def baseline_need(self) -> int:
        """mlx-lm holds the whole checkpoint, scales and biases widened to float32."""
        return int(1.25 * self.info["checkpoint_bytes"]) + GiB


def ensure_models(
    preset: str,
    data: Path,
    *,
    layers: int | None,
    vocab: int | None,
    routing: dict,
    seed: int,
    dtype: str | None = None,
) -> Models:
    from streamer.repack import repack

    config = preset_config(preset, num_hidden_layers=layers, vocab_size=vocab, torch_dtype=dtype)
    spec = checkpoint_spec(config, routing=routing, seed=seed)
    tag = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    name = (
        preset
        + (f"-L{layers}" if layers else "")
        + (f"-v{vocab}" if vocab else "")
        + (f"-{dtype}" if dtype else "")
    )
    mlx, streaming = data / f"{name}-{tag}-mlx", data / f"{name}-{tag}-streaming"
    if read_spec(mlx) != spec:
        log(f"[bench] generating {mlx}")
        write_checkpoint(mlx, config, routing=routing, seed=seed, log=log)
    if (
        read_spec(streaming) != spec
    ):  # the repacker carries bench_spec.json over, and publishes atomically
        log(f"[bench] repacking into {streaming}")
        repack(mlx, streaming, force=True, log=log)
    return Models(name, mlx, streaming)


# -- running engines -----------------------------------------------------------------------------
def worker(engine: str, models: Models, *args: str, folder: Path | None = None) -> dict:
    """One engine in its own process; `folder` overrides the model folder (streamer on the
    MLX download itself streams it in place)."""
    folder = folder or (models.streaming if engine == "streamer" else models.mlx)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    before = mem_available()
    proc = subprocess.run(
        [sys.executable, str(BENCH / "worker.py"), engine, str(folder), *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(f"[bench] the {engine} worker failed (exit {proc.returncode})")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["mem_available_before"] = before
    return result


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


# -- scenarios -----------------------------------------------------------------------------------
def measure_disk(models: Models, args: argparse.Namespace) -> dict:
    log(
        f"[bench] disk: cold {models.record_bytes / 1e6:.1f} MB records, "
        f"{models.info['top_k']} per layer"
    )
    disk = pagecache.disk_bandwidth(
        models.expert_files,
        models.record_bytes,
        group=models.info["top_k"],
        concurrency=args.io_concurrency,
        budget=args.disk_budget,
    )
    engine = disk["engine_gbps"]
    log(
        f"[bench] disk: WILLNEED+populate (the engine's way) {engine or float('nan'):.2f} GB/s, "
        f"pread x{args.io_concurrency} {disk['pread_gbps']:.2f} GB/s, "
        f"mmap page faults {disk['mmap_copy_gbps']:.2f} GB/s"
    )
    disk["read_gbps"] = engine or disk["pread_gbps"]  # what the I/O bound divides by
    return disk


def common_args(
    args: argparse.Namespace,
    *,
    repeats: int | None = None,
    prompt: str | None = None,
    decode: int | None = None,
) -> list[str]:
    return [
        "--prompt-tokens",
        prompt or str(args.prompt_tokens),
        "--decode-tokens",
        str(decode or args.decode_tokens),
        "--repeats",
        str(repeats or args.repeats),
        "--temp",
        str(args.temp),
        "--memory-budget",
        str(args.memory_budget),
    ]


def baseline_fits(models: Models, args: argparse.Namespace) -> bool:
    if args.no_baseline:
        return False
    fits = mem_available() - models.baseline_need >= args.reserve
    if not fits:
        log(
            f"[bench] mlx-lm resident needs ~{models.baseline_need / 1e9:.1f} GB: it does not fit, "
            "skipped"
        )
    return fits


def not_run(models: Models, args: argparse.Namespace) -> dict | None:
    return None if args.no_baseline else {"fits": False, "needs_bytes": models.baseline_need}


def scenario_warm(models: Models, args: argparse.Namespace, disk: dict) -> dict:
    streamer, baseline, routing = [], [], None
    for r in range(args.rounds):  # alternate engines so drift on a shared machine hits both
        log(f"[bench] round {r + 1}/{args.rounds}: streamer")
        pagecache.warm(models.expert_files, log=log if r == 0 else lambda _: None)
        cached = pagecache.resident_fraction(models.expert_files)
        streamer.append(worker("streamer", models, *common_args(args), "--warmup"))
        if baseline_fits(models, args):
            log(f"[bench] round {r + 1}/{args.rounds}: mlx-lm resident")
            pagecache.warm(models.checkpoint_files)
            extra = (
                ["--routing", str(args.routing_tokens)] if r == 0 and args.routing_tokens else []
            )
            baseline.append(worker("mlx_lm", models, *common_args(args), "--warmup", *extra))
            routing = routing or baseline[-1].get("routing")

    def rate(w: dict) -> float:
        return statistics.median(r["decode_tok_s"] for r in w["runs"])

    return {
        "expert_files_cached_before": cached,
        "ratio_per_round": [
            rate(s) / rate(b) for s, b in zip(streamer, baseline)
        ],  # neighbours in time
        "streamer": summarize(streamer, models, disk["read_gbps"]),
        "mlx_lm": summarize(baseline, models, None) if baseline else not_run(models, args),
        "routing": routing,
    }


def scenario_cold(models: Models, args: argparse.Namespace, disk: dict) -> dict:
    streamer, baseline = [], []
    for r in range(
        args.repeats
    ):  # one process per run: pages a process has mapped cannot be dropped
        log(f"[bench] cold run {r + 1}/{args.repeats}: streamer")
        pagecache.drop(models.expert_files)
        streamer.append(worker("streamer", models, *common_args(args, repeats=1), "--cold-decode"))
        if baseline_fits(models, args):
            log(f"[bench] cold run {r + 1}/{args.repeats}: mlx-lm resident (cold load)")
            pagecache.drop(models.checkpoint_files)
            baseline.append(worker("mlx_lm", models, *common_args(args, repeats=1)))
    return {
        "streamer": summarize(streamer, models, disk["read_gbps"]),
        "mlx_lm": summarize(baseline, models, None) if baseline else not_run(models, args),
    }


def scenario_squeezed(models: Models, args: argparse.Namespace, disk: dict) -> dict:
    # The serial bound of a squeezed run: its miss bytes at the measured cold-read rate, plus a
    # token's time with every expert cached (compute of the active weights and the resident part).
    log("[bench] squeezed: streamer with the page cache warm, for the serial bound")
    pagecache.warm(models.expert_files)
    warm = summarize(
        [worker("streamer", models, *common_args(args), "--warmup")], models, disk["read_gbps"]
    )
    points = []
    floor = args.reserve + models.streamer_need
    for target in args.available:
        if target < floor:
            log(
                f"[bench] refusing {target / GiB:.1f} GiB: a run needs "
                f"{models.streamer_need / GiB:.1f} GiB "
                f"and {args.reserve / GiB:.1f} GiB must stay free for the machine"
            )
            continue
        size = mem_available() - target
        point = {"target_available": target, "balloon_bytes": max(size, 0)}
        with Balloon(max(size, 0), reserve=floor) as balloon:
            point["balloon_method"] = balloon.method
            point["mem_available"] = mem_available()
            log(f"[bench] squeezed to {point['mem_available'] / GiB:.1f} GiB available: streamer")
            pagecache.drop(models.expert_files)
            s = worker("streamer", models, *common_args(args), "--warmup")
            point["streamer"] = summary = summarize([s], models, disk["read_gbps"])
            bound = warm["ms_per_token"] + (summary.get("io_ms_per_token") or 0.0)
            point["serial_bound_ms_per_token"] = bound
            point["vs_serial_bound"] = summary["ms_per_token"] / bound
            if not args.no_baseline and target >= models.baseline_need + args.reserve:
                log("[bench] squeezed: mlx-lm resident")
                point["mlx_lm"] = summarize(
                    [worker("mlx_lm", models, *common_args(args), "--warmup")], models, None
                )
            else:
                point["mlx_lm"] = not_run(models, args)
            point["mem_available_after"] = mem_available()
            point["balloon_survived"] = balloon.alive()
        points.append(point)
    return {"reserve_bytes": args.reserve, "warm_streamer": warm, "points": points}


def scenario_layouts(models: Models, args: argparse.Namespace, disk: dict) -> dict:
    import layouts

    return layouts.scenario_layouts(models, args, disk, worker, summarize, common_args, log)


def scenario_prefill(models: Models, args: argparse.Namespace, disk: dict) -> dict:
    lengths = ",".join(str(n) for n in args.lengths)
    engines = {}
    for engine, files in (("streamer", models.expert_files), ("mlx_lm", models.checkpoint_files)):
        if engine == "mlx_lm" and not baseline_fits(models, args):
            continue
        log(f"[bench] prefill {lengths}: {engine}")
        pagecache.warm(files)
        engines[engine] = worker(
            engine, models, *common_args(args, prompt=lengths, decode=2), "--warmup"
        )
    rows = []
    for n in args.lengths:
        row = {"prompt_tokens": n}
        for engine, result in engines.items():
            picked = {**result, "runs": [r for r in result["runs"] if r["prompt_tokens"] == n]}
            summary = summarize([picked], models, disk["read_gbps"])
            row[engine] = {
                k: summary.get(k)
                for k in (
                    "ttft_s",
                    "prefill_bytes_read_per_run",
                    "peak_rss_bytes",
                    "peak_mlx_bytes",
                )
            }
        rows.append(row)
    return {"lengths": rows}


# -- command line --------------------------------------------------------------------------------
def size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().rstrip("IB")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="streamer benchmark", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("scenario", nargs="?", choices=SCENARIOS, default="warm")
    ap.add_argument("--quick", action="store_true", help="small model, few tokens (about 20 s)")
    ap.add_argument(
        "--json", action="store_true", help="print the result as one JSON object on stdout"
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-30b-a3b-12l")
    ap.add_argument("--layers", type=int, help="override the preset's layer count")
    ap.add_argument("--vocab", type=int, help="override the preset's vocabulary size")
    ap.add_argument("--skew", type=float, default=ROUTING["skew"], help="synthetic router skew")
    ap.add_argument(
        "--topic-share", type=float, default=ROUTING["topic_share"], help="routing reuse (0..1)"
    )
    ap.add_argument(
        "--stickiness", type=float, default=ROUTING["stickiness"], help="topic persistence"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        help="the checkpoint's float dtype (default: the preset's bfloat16). On CPU both engines "
        "compute in float32, so float32 checkpoints are what a Mac computing in bfloat16 sees: "
        "no conversion, experts used in place",
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("STREAMER_BENCH_DATA", Path.home() / ".cache/streamer-bench")),
        help="where generated checkpoints live (multi-GB: not the repo)",
    )
    ap.add_argument("--results", type=Path, default=BENCH / "results")
    ap.add_argument("--tag", help="appended to the result file's name (e.g. resident)")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per worker (cold: runs)")
    ap.add_argument(
        "--rounds", type=int, default=2, help="warm: alternating streamer/mlx-lm rounds"
    )
    ap.add_argument(
        "--temp",
        type=float,
        default=1.0,
        help="sampling temperature, seeded (0: greedy; loops on random weights)",
    )
    ap.add_argument(
        "--routing-tokens",
        type=int,
        default=64,
        help="warm: decode steps of the routing profile (0: skip)",
    )
    ap.add_argument(
        "--io-concurrency",
        type=int,
        default=1,
        help="pread threads of the disk measurement's pread figure",
    )
    ap.add_argument(
        "--disk-budget", type=size, default=256 << 20, help="bytes read to measure the disk"
    )
    ap.add_argument(
        "--available",
        type=lambda t: [size(x) for x in t.split(",")],
        default=[8 * GiB, 6 * GiB, 4 * GiB],
        help="squeezed: memory left available, comma-separated (e.g. 6G,4G)",
    )
    ap.add_argument(
        "--reserve", type=size, default=2 * GiB, help="memory that must always stay available"
    )
    ap.add_argument(
        "--lengths", type=lambda t: [int(x) for x in t.split(",")], default=[128, 512, 2048]
    )
    ap.add_argument("--no-baseline", action="store_true", help="streamer only")
    ap.add_argument(
        "--memory-budget",
        type=size,
        default=0,
        help="streamer's memory_budget: 0 streams every expert (page cache only); "
        "1T keeps all resident",
    )
    return ap


QUICK = {
    "preset": "quick",
    "decode_tokens": 16,
    "prompt_tokens": 16,
    "repeats": 3,
    "rounds": 1,
    "routing_tokens": 16,
    "disk_budget": 16 << 20,
    "lengths": [32, 128],
}


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.quick:
        defaults = parser().parse_args([])
        for key, value in QUICK.items():  # quick defaults, unless given explicitly
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    start = time.perf_counter()
    models = ensure_models(
        args.preset,
        args.data,
        layers=args.layers,
        vocab=args.vocab,
        routing={
            "skew": args.skew,
            "topic_share": args.topic_share,
            "stickiness": args.stickiness,
        },
        seed=args.seed,
        dtype=args.dtype,
    )
    disk = measure_disk(models, args)
    run = {
        "warm": scenario_warm,
        "cold": scenario_cold,
        "squeezed": scenario_squeezed,
        "prefill": scenario_prefill,
        "layouts": scenario_layouts,
    }
    result = run[args.scenario](models, args, disk)
    if args.scenario in ("warm", "cold"):
        result = {**flat(result), **result}
    result = {
        "scenario": args.scenario,
        **result,
        "model": models.info,
        "disk": disk,
        "settings": {k: v for k, v in vars(args).items() if k not in ("data", "results", "json")},
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "mlx": mx.__version__,
            "device": str(mx.default_device()),
            "mem_total_bytes": _mem_total(),
        },
        "wall_s": time.perf_counter() - start,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{models.name}-{args.scenario}{'-' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    log(f"[bench] wrote {path} ({result['wall_s']:.0f} s)")
    if args.json:
        print(json.dumps(result, default=str))
    else:
        log(headline(result))
    return result


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


def _mem_total() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


if __name__ == "__main__":
    main()
