"""Speculative decoding against plain decoding, side by side in one run on this CPU.

    python bench/speculative.py [--data DIR] [--layers 4] [--tokens 48] [--k 3]
                                [--rates 0,0.25,0.5,0.75,0.9,1] [--budgets 0.1,0.25,0.5]
                                [--draft DIR]     # a draft trained beside the demo model
    python bench/speculative_plot.py              # the plot and the README table from the JSON

Two parts. The cost: on the real-shaped generated checkpoint (Qwen3-30B-A3B's layers, fewer of
them; random weights, synthetic routing) a plain greedy run, then the same run with an oracle
drafter whose drafts are the model's own greedy tokens, each kept true with probability `rate`
(1: the upper bound) and otherwise replaced by a wrong token: tok/s, expert bytes, syncs and
waste per token at each acceptance rate, warm (mapped, every expert in the page cache) and
squeezed (a slot pool of a share of the experts, read around the page cache: every miss a disk
read). The acceptance: on the trained demo model, what prompt lookup keeps on code and on prose,
and what a small trained draft keeps. Every speculative run is checked to print the plain run's
tokens. Writes bench/results/speculative.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # streamer, fixtures: the tree
from engines import log  # noqa: E402
from models import ensure_models  # noqa: E402
from presets import ROUTING  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "speculative.json"
CODE = Path(__file__).resolve().parents[1] / "streamer" / "speculative" / "drafters.py"
PROSE = (
    "The page cache is the main cache. A mixture-of-experts decoder touches only the experts its "
    "router picks, so the engine keeps the attention, the norms and the embeddings in memory and "
    "reads each token's routed experts from disk. The page cache is the main cache: an expert "
    "read once stays in memory until the kernel needs the pages for something else."
)


class Oracle:
    """Drafts the model's own greedy tokens `truth`, each true with probability `rate`."""

    def __init__(self, truth: list[int], rate: float, vocab: int, seed: int = 0):
        self.truth, self.rate, self.vocab = truth, rate, vocab
        self.rng = np.random.default_rng(seed)
        self.done = 0  # tokens generated so far

    def start(self, tokens: list[int]) -> None:
        self.done = 0

    def draft(self, n: int) -> list[int]:
        true = self.truth[self.done : self.done + n]
        keep = self.rng.random(len(true)) < self.rate
        return [t if k else (t + 1) % self.vocab for t, k in zip(true, keep)]

    def advance(self, drafts: list[int], accepted: int, token: int) -> None:
        self.done += accepted + 1


def run(model, tokenizer, prompt, tokens: int, drafter=None, k: int = 3, **kwargs) -> dict:
    """One greedy run through the speculative loop (plain: streamer.stream_generate): its tokens,
    decode tok/s and per-token traffic."""
    from streamer.generate import stream_generate
    from streamer.speculative.stream import responses

    stats = model.streamer.stats
    if drafter is None:
        steps = stream_generate(model, tokenizer, prompt, tokens, **kwargs)
    else:  # a drafter of the bench's own (the oracle): the loop itself
        stats.reset()
        steps = responses(model, tokenizer, prompt, drafter, max_tokens=tokens, **kwargs)
    out, start, first = [], time.perf_counter(), None
    for r in steps:
        out.append(r.token)
        first = first or time.perf_counter()
    seconds = time.perf_counter() - first
    decode, drafts, n = stats.decode, stats.drafts, max(stats.decode_tokens, 1)
    return {
        "tokens": out,
        "decode_tok_s": (len(out) - 1) / seconds,
        "first_token_s": first - start,
        "expert_mb_per_token": decode.bytes_read / n / 1e6,
        "syncs_per_token": decode.syncs / n,
        "passes": drafts.passes,
        "tokens_per_pass": drafts.emitted / drafts.passes if drafts.passes else 1.0,
        "acceptance": drafts.accepted / drafts.drafted if drafts.drafted else None,
        "wasted_mb_per_token": drafts.wasted_bytes / n / 1e6,
        "page_cache_hit_rate": decode.page_cache_hit_rate,
    }


def cost_curve(args, regime: str, load_kwargs: dict, models) -> dict:
    """Plain, then the oracle at each rate, in one process on one loaded model."""
    import mlx.core as mx

    import streamer

    model, tokenizer = streamer.load(models.streaming, **load_kwargs)
    log(f"[spec] {regime}: {model.streamer.residency}")
    prompt = [int(t) for t in np.random.default_rng(0).integers(4, 512, 16)]
    run(model, tokenizer, prompt, 8)  # warm: the page cache, the kernels
    plain = run(model, tokenizer, prompt, args.tokens)
    truth = plain.pop("tokens")
    rows = []
    for rate in args.rates:
        oracle = Oracle(truth, rate, models.info["vocab_size"])
        row = run(model, tokenizer, prompt, args.tokens, oracle, args.k, num_draft_tokens=args.k)
        assert row.pop("tokens") == truth, f"{regime}: rate {rate} changed the output"
        rows.append({"rate": rate, **row})
        log(
            f"[spec] {regime} rate {rate}: {row['decode_tok_s']:.2f} tok/s (plain "
            f"{plain['decode_tok_s']:.2f}), {row['tokens_per_pass']:.2f} tokens/pass"
        )
    del model
    mx.clear_cache()
    return {"regime": regime, "load": _printable(load_kwargs), "plain": plain, "oracle": rows}


def acceptance(args) -> list[dict]:
    """Prompt lookup and a small draft on the trained demo model (repacked, 4-bit, streamed)."""
    import tempfile

    import streamer
    from streamer.repack import Quantize, repack
    from streamer.speculative.draft_model import load_draft_model
    from streamer.speculative.drafters import DraftModel, PromptLookup

    demo = Path(streamer.__file__).parent / "demo_model"
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        repack(demo, Path(tmp) / "demo", quantize=Quantize(4), force=True, log=lambda _: None)
        model, tokenizer = streamer.load(Path(tmp) / "demo", memory_budget=0)
        code = CODE.read_text()[:1500]
        cases = {"code": code, "prose": PROSE}
        drafters = {"prompt lookup": lambda: PromptLookup()}
        if args.draft:
            draft = load_draft_model(args.draft, tokenizer)
            drafters["small draft"] = lambda: DraftModel(draft, _greedy())
        for text_kind, text in cases.items():
            prompt = tokenizer.encode(text)
            plain = run(model, tokenizer, prompt, args.tokens)
            for name, make in drafters.items():
                row = run(
                    model, tokenizer, prompt, args.tokens, make(), args.k, num_draft_tokens=args.k
                )
                assert row.pop("tokens") == plain["tokens"], (name, text_kind)
                out.append({"drafter": name, "text": text_kind, **row})
                log(f"[spec] demo {name} on {text_kind}: acceptance {row['acceptance']}")
    return out


def _greedy():
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(0.0)


def _device() -> str:
    from streamer.loading.backend import backend

    return backend()


def _printable(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if isinstance(v, (int, float, str, bool, type(None)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "streamer-bench")
    ap.add_argument("--preset", default="qwen3-30b-a3b-12l", help="quick: seconds, not real-shaped")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rates", default="0,0.25,0.5,0.75,0.9,1")
    ap.add_argument("--budgets", default="0.1,0.25,0.5", help="slot pool shares of the experts")
    ap.add_argument("--draft", type=Path, help="a draft model with the demo's tokenizer")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--no-warm", action="store_true", help="only the squeezed regimes")
    ap.add_argument("--no-acceptance", action="store_true", help="no runs on the demo model")
    ap.add_argument(
        "--page-cache",
        action="store_true",
        help="slot pools read through the page cache (warm), not around it: as the H200 runs",
    )
    ap.add_argument("--dtype", default="float32", help="the checkpoint's scales (bfloat16: a GPU)")
    args = ap.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    models = ensure_models(
        args.preset,
        args.data,
        layers=args.layers,
        vocab=None,
        routing=ROUTING,
        seed=0,
        dtype=None if args.dtype == "bfloat16" else args.dtype,  # the preset's own: bfloat16
    )
    experts = models.info["expert_bytes"]
    regimes = (
        [] if args.no_warm else [("warm, in place", {"memory_budget": 0, "read_path": "mapped"})]
    )
    for share in [float(b) for b in args.budgets.split(",") if b]:
        regimes.append(
            (
                ("" if args.page_cache else "squeezed, ")
                + (f"slot pool {share:.0%} of the experts" if share else "one layer's experts"),
                {
                    "memory_budget": int(share * experts),
                    "read_path": "slots",
                    "bypass_page_cache": not args.page_cache,
                },
            )
        )
    result = {
        "model": models.info,
        "settings": {
            "tokens": args.tokens,
            "k": args.k,
            "rates": args.rates,
            "device": _device(),
            "checkpoint_dtype": args.dtype,
        },
        "curves": [cost_curve(args, name, kwargs, models) for name, kwargs in regimes],
        "acceptance": [] if args.no_acceptance else acceptance(args),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    log(f"[spec] wrote {args.results}")


if __name__ == "__main__":
    main()
