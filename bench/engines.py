"""Running one engine: each in its own process (bench/worker.py), so its peak memory is its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from balloon import mem_available

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def child_result(argv: list[str], what: str, env: dict | None = None) -> dict:
    """A child process's result, the JSON object its stdout ends with; `what` names it in the
    message that stops the bench when it fails."""
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def worker(engine: str, models, *args: str, folder: Path | None = None) -> dict:
    """One engine in its own process on `models` (a models.Models); `folder` overrides the model
    folder (streamer on the MLX download itself streams it in place)."""
    folder = folder or (models.streaming if engine == "streamer" else models.mlx)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    before = mem_available()
    argv = [sys.executable, str(BENCH / "worker.py"), engine, str(folder), *args]
    result = child_result(argv, f"[bench] the {engine} worker", env)
    result["mem_available_before"] = before
    return result


def common_args(
    args,
    *,
    repeats: int | None = None,
    prompt: str | None = None,
    decode: int | None = None,
) -> list[str]:
    routing = ["--routing", args.routing] if args.routing else []  # routing_model's profile
    threads = getattr(args, "threads", None)
    threads = [] if threads is None else ["--threads", str(threads)]
    return [
        *routing,
        *threads,
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
