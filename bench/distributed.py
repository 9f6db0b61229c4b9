#!/usr/bin/env python
"""Expert-parallel decode on this machine: 1 rank against 2 ranks (ring backend on 127.0.0.1),
each rank pinned to its own core, on shards split two ways: interleaved, and balanced by a
routing trace (`streamer split --trace`) taken on another prompt than the measured one.

The last run is the control: two independent single-process runs at once, one per core, which
shows what this (shared, 2-core) machine does to two processes computing side by side. The four
runs are repeated in rounds (--rounds), one after the other, and each round's ratios to its own
1-rank run are reported side by side: on a shared machine the load moves between runs, and a
ratio taken within one round is less noisy than times compared across rounds.

For each run: decode ms/token on both read paths (sync-free: the layers' files are all in the
page cache and the routing stays on the device; synced: each layer learns its routing on the
host and prefetches its routed experts, as a model larger than memory does, here with the
reads served from the page cache), expert bytes read per rank per token, all_sums per token and
one all_sum's cost at the decode size (a MoE layer's) and at 4 bytes (the stop flag that serve
and chat sum once per token). Results go to bench/results/distributed.json.

    python bench/distributed.py [--preset qwen3-30b-a3b --layers 4 --vocab 37984 --tokens 12
                                 --rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))


def worker(args: argparse.Namespace) -> None:
    rank = int(os.environ.get("MLX_RANK", "0"))
    core = args.core if args.core is not None else rank
    os.sched_setaffinity(0, {core % os.cpu_count()})  # each rank on its own core
    import mlx.core as mx
    import numpy as np
    from mlx_lm.generate import generate_step, generation_stream
    from mlx_lm.sample_utils import make_sampler

    import streamer
    from streamer.parallel.group import gather_floats, launched_group, time_all_sum

    group = launched_group()
    folder = Path(args.model.replace("{rank}", str(rank)))
    for path in sorted((folder / "experts").iterdir()):  # into the page cache: the warm case
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    model, _ = streamer.load(folder, memory_budget=0, group=group)
    stats = model.streamer.stats
    sampler = make_sampler(temp=0.0)
    if args.trace_out:  # the routing of another prompt, for the --trace split
        stats.trace = []
        other = mx.array(np.random.default_rng(1).integers(0, 1000, size=16))
        for _ in generate_step(other, model, max_tokens=8 * args.tokens, sampler=sampler):
            pass
        experts = np.array([e for _, e in stats.trace], dtype=np.int16)
        shape = (-1, stats.moe_layers, experts.shape[-1])  # [tokens, MoE layers, top_k]
        np.savez(args.trace_out, experts=experts.reshape(shape))
        return
    prompt = mx.array(np.random.default_rng(0).integers(0, 1000, size=16))
    row = []
    for mode in ("warmup", "sync-free", "synced"):
        stats.reset()
        stats.trace = [] if mode == "synced" else None  # wanting the routing forces the sync
        tokens = 4 if mode == "warmup" else args.tokens
        steps = generate_step(prompt, model, max_tokens=tokens, sampler=sampler)
        next(steps)  # the prompt and the first token
        stats.reset()
        start = time.perf_counter()
        n = sum(1 for _ in steps)
        mx.synchronize(generation_stream)
        seconds = time.perf_counter() - start
        decode = stats.decode
        stats.trace = None
        if mode != "warmup":
            row += [
                seconds / n * 1e3,
                decode.bytes_read / n,
                decode.experts_read / n,
                decode.syncs / n,
                decode.collectives / n,
            ]
    each = decode.collective_bytes // max(decode.collectives, 1)
    all_sum = time_all_sum(group, (max(each // 4, 1),), mx.float32, repeat=50) if group else 0.0
    flag = time_all_sum(group, (1,), mx.int32, repeat=50) if group else 0.0
    row += [all_sum, each, flag]
    rows = gather_floats(group, row) if group else np.array([row])
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows.tolist()))


def launch(
    args: argparse.Namespace, model: str, ranks: int, out: Path, extra: tuple[str, ...] = ()
) -> list[list[float]] | None:
    """Run the worker on `ranks` ranks of a ring group on 127.0.0.1, started through MLX's own
    environment variables (MLX_RANK, MLX_HOSTFILE) rather than mlx.launch: on this 2-core VM
    the launcher's polling threads take a large share of the CPU from the ranks."""
    command = [sys.executable, __file__, "--worker", "--model", model, "--out", str(out)]
    command += ["--tokens", str(args.tokens), *extra]
    hostfile = out.with_suffix(".hosts.json")
    from mlx_launch import free_ports  # the CI tests' helper: free ports in a row

    base = free_ports(ranks)
    hostfile.write_text(json.dumps([[f"127.0.0.1:{base + r}"] for r in range(ranks)]))
    envs = [{**ENV, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)} for r in range(ranks)]
    if ranks == 1:
        envs = [ENV]
    procs = [subprocess.Popen(command, env=env) for env in envs]
    for proc in procs:
        if proc.wait(timeout=1800):
            raise SystemExit(f"a rank failed: {proc.args}")
    return None if extra else json.loads(out.read_text())


def side_by_side(args: argparse.Namespace, model: str, out: Path) -> list[list[float]]:
    """Two independent single-process runs at once, one per core: what this machine does to two
    processes computing together, without any collective (the control for the 2-rank run)."""
    procs = []
    for core in range(2):
        command = [sys.executable, __file__, "--worker", "--model", model, "--core", str(core)]
        command += ["--out", f"{out}.{core}", "--tokens", str(args.tokens)]
        procs.append(subprocess.Popen(command, env=ENV))
    for proc in procs:
        if proc.wait(timeout=1800):
            raise SystemExit(f"side-by-side run failed: {proc.args}")
    return [json.loads(Path(f"{out}.{core}").read_text())[0] for core in range(2)]


ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


FIELDS = (
    "ms_per_token",
    "expert_bytes_per_token",
    "experts_per_token",
    "syncs_per_token",
    "all_sums_per_token",
)


def summary(rows: list[list[float]]) -> dict:
    result = {}
    for index, mode in enumerate(("sync-free", "synced")):
        part = [r[index * 5 : index * 5 + 5] for r in rows]
        result[mode] = {name: [p[i] for p in part] for i, name in enumerate(FIELDS)}
    result["all_sum_seconds"] = max(r[10] for r in rows)
    result["all_sum_bytes"] = rows[0][11]
    result["stop_flag_all_sum_seconds"] = max(r[12] for r in rows)
    return result


def ratios(round_: dict) -> dict:
    """Each run's ms/token over the same round's 1-rank run (slowest rank or process), by path."""
    alone = round_["1 rank"]
    return {
        run: {
            mode: max(round_[run][mode]["ms_per_token"]) / alone[mode]["ms_per_token"][0]
            for mode in ("sync-free", "synced")
        }
        for run in ("2 ranks", "2 ranks, trace split", "2 independent processes at once")
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--core", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--trace-out", help=argparse.SUPPRESS)
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=151936 // 4)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data", type=Path, default=Path("/tmp/streamer-bench-data"))
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from models import ensure_models
    from presets import ROUTING

    from streamer.parallel.split import split

    models = ensure_models(
        args.preset,
        args.data,
        layers=args.layers,
        vocab=args.vocab,
        routing=ROUTING,
        seed=0,
        dtype="float32",  # float32 scales: no conversion, so the sync-free path exists on CPU
    )
    tmp = args.data / "distributed-run.json"
    trace = args.data / f"{models.streaming.name}-trace.npz"
    if not trace.exists():  # the routing of another prompt than the measured one
        launch(args, str(models.streaming), 1, tmp, ("--trace-out", str(trace)))
    splits = {"interleaved": None, "trace": trace}
    shards = {way: args.data / f"{models.streaming.name}-{way}-shard{{rank}}" for way in splits}
    for way, folders in shards.items():
        for rank in range(2):
            folder = Path(str(folders).replace("{rank}", str(rank)))
            if not folder.exists():
                split(models.streaming, folder, rank, 2, trace=splits[way])
    args.results.mkdir(parents=True, exist_ok=True)
    result = {"model": models.info, "tokens": args.tokens, "rounds": []}
    for _ in range(args.rounds):
        round_ = {"load_average": os.getloadavg()}
        round_["1 rank"] = summary(launch(args, str(models.streaming), 1, tmp))
        round_["2 ranks"] = summary(launch(args, str(shards["interleaved"]), 2, tmp))
        round_["2 ranks, trace split"] = summary(launch(args, str(shards["trace"]), 2, tmp))
        control = side_by_side(args, str(models.streaming), tmp)
        round_["2 independent processes at once"] = summary(control)
        round_["load_average_after"] = os.getloadavg()
        round_["ms_per_token_over_1_rank"] = ratios(round_)
        result["rounds"].append(round_)
    (args.results / "distributed.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
