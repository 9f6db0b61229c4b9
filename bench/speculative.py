"""Speculative decoding against plain decoding, side by side in one run on this CPU.

    python bench/speculative.py [--data DIR] [--layers 4] [--tokens 48] [--k 3]
                                [--rates 0,0.25,0.5,0.75,0.9,1] [--budgets 0.1,0.25,0.5]
                                [--draft DIR]     # a draft trained beside the demo model
    python bench/speculative_plot.py              # the plot and the README table from the JSON
    # a GPU (bench/cuda_check.sh speculative): an existing checkpoint, budgets in bytes
    python bench/speculative.py --models MLX_DIR STREAMING_DIR --budgets 4G,24G --page-cache \
        --no-warm --no-acceptance --prompt-lookup --repeats 2

Two parts. The cost: on the real-shaped generated checkpoint (Qwen3-30B-A3B's layers, fewer of
them; random weights, synthetic routing) a plain greedy run, then the same run with an oracle
drafter whose drafts are the model's own greedy tokens, each kept true with probability `rate`
(1: the upper bound) and otherwise replaced by a wrong token: tok/s, expert bytes, syncs and
waste per token at each acceptance rate, warm (mapped, every expert in the page cache) and
squeezed (a slot pool of a share of the experts, read around the page cache: every miss a disk
read). The acceptance: on the trained demo model, what prompt lookup keeps on code and on prose,
and what a small trained draft keeps (--prompt-lookup: prompt lookup on the cost curves' own
prompt and model too). Every speculative run is checked to print the plain run's tokens (where one
does not, the first token that differs is recorded and the run exits 1 after writing the JSON: a
GPU's multi-row kernels may round otherwise than one row's), and one verify pass's logits are
compared with single steps'. Writes bench/results/speculative.json.
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
from models import Models, ensure_models  # noqa: E402
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

    def start(self, tokens: list[int], step: int) -> None:  # step: the prefill's, unused
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
    """Plain, then the oracle at each rate (and prompt lookup), in one process on one loaded model;
    each run's tok/s the best of args.repeats, each drafted run's tokens checked against plain's."""
    import mlx.core as mx

    import streamer
    from streamer.speculative.drafters import PromptLookup

    model, tokenizer = streamer.load(models.streaming, **load_kwargs)
    log(f"[spec] {regime}: {model.streamer.residency}")
    prompt = [int(t) for t in np.random.default_rng(0).integers(4, 512, 16)]
    vocab = models.info["vocab_size"]
    # warm: the page cache and a slot pool, the kernels of one row and of the passes' 2-4 rows
    truth = run(model, tokenizer, prompt, args.tokens)["tokens"]
    run(model, tokenizer, prompt, 12, Oracle(truth, 0.5, vocab), args.k, num_draft_tokens=args.k)
    plains = [run(model, tokenizer, prompt, args.tokens) for _ in range(args.repeats)]
    plain = best(plains)
    truth = plain.pop("tokens")
    plain["repeats_agree"] = all(p["tokens"] == truth for p in plains)
    own, runs = own_output(model, tokenizer, prompt, truth, vocab, args)
    plain["oracle_truth"] = "plain" if own == truth else f"the loop's own, after {runs} runs"
    drafters = [
        (f"oracle {rate}", rate, lambda rate=rate: Oracle(own, rate, vocab)) for rate in args.rates
    ]
    if args.prompt_lookup:
        drafters.append(("prompt lookup", None, PromptLookup))
    rows, lookups = [], []
    for name, rate, make in drafters:
        runs = [
            run(model, tokenizer, prompt, args.tokens, make(), args.k, num_draft_tokens=args.k)
            for _ in range(args.repeats)
        ]
        row = {"rate": rate} if rate is not None else {"drafter": name}
        row |= best(runs)
        row["first_difference"] = first_difference(truth, [r.pop("tokens") for r in runs])
        row["exact"] = row.pop("tokens") == truth and row["first_difference"] is None
        (rows if rate is not None else lookups).append(row)
        log(
            f"[spec] {regime} {name}: {row['decode_tok_s']:.2f} tok/s (plain "
            f"{plain['decode_tok_s']:.2f}), acceptance {row['acceptance']}, "
            f"{row['tokens_per_pass']:.2f} tokens/pass, "
            + ("exact" if row["exact"] else f"DIFFERS from token {row['first_difference']}")
        )
    chunk = chunk_against_steps(model, prompt, truth[: args.k + 1])
    log(f"[spec] {regime}: one pass of {args.k + 1} against single steps: {chunk}")
    del model
    mx.clear_cache()
    return {
        "regime": regime,
        "load": _printable(load_kwargs),
        "plain": plain,
        "oracle": rows,
        "drafters": lookups,
        "pass_against_steps": chunk,
    }


def own_output(model, tokenizer, prompt, truth: list[int], vocab: int, args) -> tuple[list, int]:
    """What the oracle drafts: tokens the loop prints when drafting them at rate 1. On the CPU a
    pass computes each position as a single step does, so that is plain decoding's output; on a
    GPU a pass of k+1 rows may round otherwise than one row (other kernels), its greedy tokens then
    leave plain's, and drafting plain's would measure no acceptance at all. There the fixed point:
    draft the last run's output until a run prints what it drafted (a few runs), and how many."""
    for n in range(1, 6):
        drafter = Oracle(truth, 1.0, vocab)
        out = run(model, tokenizer, prompt, args.tokens, drafter, args.k, num_draft_tokens=args.k)
        if out["tokens"] == truth:
            return truth, n
        truth = out["tokens"]
    log("[spec] no fixed point in 5 runs: the oracle drafts the last run's output")
    return truth, n


def best(runs: list[dict]) -> dict:
    """The fastest of repeated runs (traffic is the same each time), every run's tok/s beside."""
    row = dict(max(runs, key=lambda r: r["decode_tok_s"]))
    row["decode_tok_s_runs"] = [r["decode_tok_s"] for r in runs]
    return row


def first_difference(truth: list[int], outputs: list[list[int]]) -> int | None:
    """The first position where any output differs from `truth` (a shorter one: at its end)."""
    found = [
        next((i for i, (a, b) in enumerate(zip(truth, out)) if a != b), min(len(truth), len(out)))
        for out in outputs
        if out != truth
    ]
    return min(found) if found else None


def chunk_against_steps(model, prompt: list[int], tokens: list[int]) -> dict:
    """One verify pass's logits for `tokens` after `prompt` against single steps' (as plain
    decoding computes them): the largest difference and whether each position's argmax agrees.
    On the CPU backend they are bit for bit the same; a GPU may run other kernels for more rows."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    def after_prompt():
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array(prompt, mx.uint32)[None], cache=cache))
        return cache

    cache = after_prompt()
    chunk = model(mx.array(tokens, mx.uint32)[None], cache=cache)[0].astype(mx.float32)
    cache = after_prompt()
    steps = mx.concatenate(
        [model(mx.array([[t]], mx.uint32), cache=cache)[0] for t in tokens]
    ).astype(mx.float32)
    agree = (chunk.argmax(-1) == steps.argmax(-1)).tolist()
    return {
        "rows": len(tokens),
        "max_abs_logit_diff": mx.abs(chunk - steps).max().item(),
        "argmax_agree": sum(agree),
        "identical": bool(mx.array_equal(chunk, steps).item()),
    }


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
    ap.add_argument(
        "--models",
        nargs=2,
        type=Path,
        metavar=("MLX_DIR", "STREAMING_DIR"),
        help="a checkpoint bench/generate_checkpoint.py wrote and its repack, not a generated one",
    )
    ap.add_argument("--prompt-lookup", action="store_true", help="prompt lookup on each curve too")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each; tok/s is the best")
    args = ap.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    if args.models:
        models = Models(args.models[1].name, *args.models)
    else:
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
    for budget in [b for b in args.budgets.split(",") if b]:
        regimes.append(
            (
                ("" if args.page_cache else "squeezed, ") + pool_name(budget, experts),
                {
                    "memory_budget": pool_bytes(budget, experts),
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
            "repeats": args.repeats,
            "device": _device(),
            "checkpoint_dtype": args.dtype,
        },
        "curves": [],
        "acceptance": [],
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    for name, kwargs in regimes:  # written after each: a crash (a GPU fault) keeps the rest
        result["curves"].append(cost_curve(args, name, kwargs, models))
        args.results.write_text(json.dumps(result, indent=2) + "\n")
    result["acceptance"] = [] if args.no_acceptance else acceptance(args)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    log(f"[spec] wrote {args.results}")
    verdict = exactness(result)
    print(verdict, file=sys.stderr, flush=True)
    sys.exit(0 if verdict.startswith("PASS") else 1)


def pool_bytes(budget: str, experts: int) -> int:
    """A slot pool's budget: a share of the experts (0.25), or bytes with a unit (4G, 512M)."""
    if budget[-1].isalpha():
        from run import size

        return size(budget)
    return int(float(budget) * experts)


def pool_name(budget: str, experts: int) -> str:
    n = pool_bytes(budget, experts)
    if n == 0:
        return "budget 0's pool"
    share = "every expert" if n >= experts else f"{n / experts:.0%} of the experts"
    return (
        f"slot pool {n / 2**30:.3g} GiB ({share})"
        if budget[-1].isalpha()
        else (f"slot pool {share}")
    )


def exactness(result: dict) -> str:
    """One line: PASS when every drafted run printed plain decoding's tokens, else where not."""
    where = result["settings"]["device"]
    rows = [
        (curve["regime"], row.get("drafter") or f"oracle {row['rate']}", row)
        for curve in result["curves"]
        for row in curve["oracle"] + curve["drafters"]
    ]
    bad = [
        f"{regime}, {name}: first differs at token {row['first_difference']}"
        for regime, name, row in rows
        if not row["exact"]
    ]
    unsteady = [c["regime"] for c in result["curves"] if not c["plain"]["repeats_agree"]]
    if unsteady:
        bad.append(f"plain decoding differs between its own repeats: {', '.join(unsteady)}")
    if bad:
        return f"FAIL speculative greedy output on {where}: " + "; ".join(bad)
    return (
        f"PASS speculative greedy output on {where}: {len(rows)} drafted runs token-identical "
        "to plain decoding"
    )


if __name__ == "__main__":
    main()
