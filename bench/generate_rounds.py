"""A one-shot generate, and the same generate again in the same process: what a first run pays.

    python bench/generate_rounds.py mlx_lm MLX_FOLDER
    python bench/generate_rounds.py streamer REPACKED --memory-budget 4G --rounds 3

`streamer generate` and `mlx_lm generate` run one generation per process: a cold pool and
whatever a process pays on first use (kernels loaded, memory first touched). bench/worker.py
times warmed runs instead. This runs the user's text prompt through stream_generate --rounds times
in one process and prints per round the decode rate (as mlx-lm measures it: from the first token)
and the milliseconds of each decode token, so a first round's extra cost shows where it falls
(every token, the first few, or the settles every 16). With streamer, mlx_lm.stream_generate on
the streamed model runs beside streamer.stream_generate each round: the difference is the
per-piece work of streamer's own generator.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx_lm
import numpy as np

import streamer
from streamer.loading.backend import default_dtype

WORDS = "Explain how a mixture of experts model routes each token to a few of its experts"


def token_times(responses) -> tuple[float, list[float]]:
    """(mlx-lm's decode tok/s, milliseconds between successive pieces) of one generation."""
    times, last = [], None
    for response in responses:
        times.append(time.perf_counter())
        last = response
    rate = last.generation_tps if hasattr(last, "generation_tps") else last.stats.generation_tps
    return rate, (np.diff(times) * 1e3).tolist()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("engine", choices=["mlx_lm", "streamer"])
    ap.add_argument("model", type=Path)
    ap.add_argument("--memory-budget", default="0", help="streamer: e.g. 4G")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, help="every round's figures as JSON")
    args = ap.parse_args(argv)
    if args.engine == "mlx_lm":
        model, tokenizer = mlx_lm.load(str(args.model))
        if default_dtype() is not None:  # as streamer computes: float32 on the CPU
            model.set_dtype(default_dtype())
        ways = {"mlx_lm.stream_generate": mlx_lm.stream_generate}
    else:
        model, tokenizer = streamer.load(args.model, memory_budget=args.memory_budget)
        ways = {
            "streamer.stream_generate": streamer.stream_generate,
            "mlx_lm.stream_generate": mlx_lm.stream_generate,
        }
    rounds = []
    for n in range(args.rounds):
        for name, generate in ways.items():
            rate, ms = token_times(generate(model, tokenizer, WORDS, max_tokens=args.max_tokens))
            rounds.append({"round": n, "way": name, "decode_tok_s": rate, "ms_per_piece": ms})
            shown = " ".join(f"{x:.0f}" for x in ms[:36])
            print(
                f"[{args.engine}] round {n} {name}: {rate:.1f} tok/s, median "
                f"{np.median(ms) if ms else 0:.2f} ms a token; first tokens, ms: {shown}",
                flush=True,
            )
    if args.out:
        args.out.write_text(json.dumps({"engine": args.engine, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
