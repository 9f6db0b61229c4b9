"""One rank of the expert-parallel tests (run by mlx.launch from tests/test_distributed.py).

Loads --model (its "{rank}" replaced by the rank) on the launched group, computes the prompt's
logits and 64 greedy tokens with the decode routing traced, and writes them with the rank's
expert statistics to --out (its "{rank}" replaced too).
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

import streamer
from streamer.distributed import launched_group


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--verify-reads", action="store_true")
    args = ap.parse_args()
    group = launched_group()
    rank = group.rank() if group else 0
    model, tokenizer = streamer.load(
        args.model.format(rank=rank), memory_budget=0, group=group, verify_reads=args.verify_reads
    )
    prompt = mx.array(tokenizer.encode(args.prompt))
    logits = model(prompt[None])
    mx.eval(logits)
    model.expert_stats.reset()
    model.expert_stats.trace = []
    steps = generate_step(prompt, model, max_tokens=args.tokens, sampler=make_sampler(temp=0.0))
    tokens = [int(token) for token, _ in steps]
    decode = model.expert_stats.decode
    traced = np.full((len(model.expert_stats.trace), 2 + 64), -1, dtype=np.int64)
    for row, (layer, experts) in zip(traced, model.expert_stats.trace):
        row[0], row[1] = layer, len(experts)
        row[2 : 2 + len(experts)] = experts
    np.savez(
        args.out.format(rank=rank),
        logits=np.array(logits.astype(mx.float32)),
        tokens=np.array(tokens),
        trace=traced,
        experts_read=decode.experts_read,
        bytes_read=decode.bytes_read,
        syncs=decode.syncs,
        layer_calls=decode.layer_calls,
    )


if __name__ == "__main__":
    main()
