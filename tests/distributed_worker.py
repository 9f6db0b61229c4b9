"""One rank of the expert-parallel tests (run by mlx.launch from tests/test_distributed.py).

For each `--run MODEL OUT MODE` (MODEL and OUT with "{rank}" replaced by the rank): loads MODEL
on the launched group, MODE "stream" (every expert streamed, each layer syncing to prefetch what
it routed, crc32 checked on first read) or "resident" (every expert in memory: the sync-free
path), computes the prompt's logits and greedy tokens with the decode
routing traced, and writes them with the rank's expert statistics to OUT (.npz). MODE
"stream+drafts" or "resident+drafts" adds the greedy tokens of speculative decoding with prompt
lookup and with `--draft` (a draft model: 24 tokens, each launch's seconds count), and on a group
a drafter that drafts otherwise on one rank only: the message every rank stops it with.
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.sample_utils import make_sampler

import streamer
from streamer.errors import StreamerError
from streamer.parallel.group import launched_group
from streamer.speculative.draft_model import load_draft_model
from streamer.speculative.drafters import DraftModel, PromptLookup
from streamer.speculative.loop import speculative_generate_step


def run(
    model_path: str, out: str, mode: str, prompt_text: str, tokens: int, group, draft=None
) -> None:
    stream = mode.startswith("stream")
    model, tokenizer = streamer.load(
        model_path, memory_budget=0 if stream else None, group=group, verify_reads=stream
    )
    prompt = mx.array(tokenizer.encode(prompt_text))
    # evaluated now: a graph left pending would run its collectives later, out of step with
    # the other ranks' (every rank must issue its all_sums in the same order)
    logits = model(prompt[None]).astype(mx.float32)
    mx.eval(logits)
    model.streamer.stats.reset()
    model.streamer.stats.trace = []
    steps = generate_step(prompt, model, max_tokens=tokens, sampler=make_sampler(temp=0.0))
    generated = [int(token) for token, _ in steps]
    mx.synchronize(generation_stream)  # generate_step leaves one step (and its all_sums) running
    decode = model.streamer.stats.decode
    trace = model.streamer.stats.trace
    widest = max((len(experts) for _, experts in trace), default=0)
    routed = np.full((len(trace), 1 + widest), -1, dtype=np.int64)
    for row, (layer, experts) in zip(routed, trace):
        row[0] = layer
        row[1 : 1 + len(experts)] = experts
    np.savez(
        out,
        logits=np.array(logits),
        tokens=np.array(generated),
        trace=routed,
        experts_read=decode.experts_read,
        bytes_read=decode.bytes_read,
        collectives=decode.collectives,
        layer_calls=decode.layer_calls,
        syncs=decode.syncs,
    )
    if mode.endswith("+drafts"):
        np.savez(out, **dict(np.load(out)), **drafted(model, tokenizer, prompt, tokens, draft))
    model.streamer.close()


class OneRankOff(PromptLookup):
    """Prompt lookup, but the last rank drafts one token more in the third pass: a rank out of
    step, which every rank must find before that pass."""

    def __init__(self, rank: int, ranks: int):
        super().__init__()
        self.off, self.passes = rank == ranks - 1, 0

    def draft(self, n: int) -> list[int]:
        self.passes += 1
        return super().draft(n) + ([1] if self.off and self.passes == 3 else [])


def drafted(model, tokenizer, prompt: mx.array, tokens: int, draft: str | None) -> dict:
    """Greedy tokens through the speculative loop with each drafter, and its passes."""
    drafters = {"lookup": (PromptLookup(), tokens)}
    if draft:
        model_drafts = DraftModel(
            load_draft_model(draft, tokenizer, model.streamer.load_dtype), make_sampler(0.0)
        )
        drafters["draft"] = (model_drafts, 24)
    results = {}
    for name, (drafter, count) in drafters.items():
        model.streamer.stats.reset()
        steps = speculative_generate_step(
            prompt, model, drafter, num_draft_tokens=3, max_tokens=count
        )
        results[f"{name}_tokens"] = np.array([token for token, _, _ in steps])
        results[f"{name}_passes"] = model.streamer.stats.drafts.passes
        results[f"{name}_accepted"] = model.streamer.stats.drafts.accepted
        results[f"{name}_drafted"] = model.streamer.stats.drafts.drafted
    group = model.streamer.group
    if group is not None:
        off = OneRankOff(group.rank(), group.size())
        try:
            list(speculative_generate_step(prompt, model, off, num_draft_tokens=3, max_tokens=16))
        except StreamerError as e:
            results["out_of_step"] = str(e)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--run", nargs=3, action="append", metavar=("MODEL", "OUT", "MODE"), required=True
    )
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--draft", help="a draft model for the +drafts modes")
    args = ap.parse_args()
    group = launched_group()
    rank = str(group.rank() if group else 0)
    for model_path, out, mode in args.run:
        run(
            model_path.replace("{rank}", rank),
            out.replace("{rank}", rank),
            mode,
            args.prompt,
            args.tokens,
            group,
            args.draft,
        )


if __name__ == "__main__":
    main()
