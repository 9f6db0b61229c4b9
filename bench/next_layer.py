"""Can a layer's experts be known a layer early? Guesses of the next layer's routing, scored on
real text against the routing itself (issue 22: adopt a prefetch only if recall says it can win).

    python bench/next_layer.py                    # the trained demo model, held-out stdlib text
    python bench/next_layer.py --model DIR --text FILE --max-tokens 4000 --out next-layer.json

An mlx-lm model (float32) runs windows of --seq tokens; for every MoE layer after the first, each
guess of its routed experts is scored by recall, |guess & routed| / k, per token:
- early: the layer's own router on the previous layer's residual after attention. Known once the
  previous layer has routed, so this layer's misses could be read beside the previous layer's.
- late: the layer's router on the previous layer's output (this layer's input before attention).
  Known only after the previous layer's experts ran: the reads would overlap this attention only.
- previous token: the experts this layer routed the token before (what a slot pool already keeps).
Each with k guesses, and with 2k (twice the bytes read, for more recall). Beside recall, what a
prefetch would move: each layer's slot pool (SlotLFU, `--pool-share` of its experts, one call a
token in order, kept across windows) holds some of the routed experts; a guess fetches those of
its experts the pool lacks. `covers`: the share of the pool's misses the guess fetched ahead;
`extra`: what it fetched that was not routed, per miss (bytes moved for nothing). Routers must
be a linear gate ranked by softmax (the qwen3_moe / qwen2_moe / olmoe layout: `mlp.gate` after
`post_attention_layernorm`); the true routing is rebuilt from the same hidden states and checked
against the one the model's experts received.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from routing_summary import held_out_text  # noqa: E402

from streamer.cli import DEMO_MODEL  # noqa: E402
from streamer.errors import StreamerError  # noqa: E402
from streamer.families.architectures import recording_routing  # noqa: E402

GUESSES = ("early", "late", "previous token")


class _Seen(nn.Module):
    """`inner`, keeping every input it is called on (in `seen.inputs`)."""

    def __init__(self, inner: nn.Module, seen: _Inputs):
        super().__init__()
        self.inner = inner
        self.seen = seen

    def __call__(self, x: mx.array) -> mx.array:
        self.seen.inputs.append(x)
        return self.inner(x)


class _Inputs:
    def __init__(self) -> None:
        self.inputs: list[mx.array] = []


def router_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers whose MLP is routed by a linear gate, or a one-line error."""
    layers = [layer for layer in model.layers if hasattr(getattr(layer, "mlp", None), "gate")]
    if len(layers) < 2 or not all(
        isinstance(layer.mlp.gate, nn.Linear) and hasattr(layer, "post_attention_layernorm")
        for layer in layers
    ):
        raise StreamerError(
            f"{type(model).__name__}: needs two or more MoE layers with a linear `mlp.gate` after "
            "`post_attention_layernorm` (qwen3_moe, qwen2_moe, olmoe layouts)."
        )
    return layers


def ranking(logits: mx.array) -> np.ndarray:
    """Each row's experts, highest router logit first."""
    return np.argsort(-np.array(logits, dtype=np.float64), axis=-1)


def top(ranked: np.ndarray, n: int) -> np.ndarray:
    """The first `n` experts of each row of a `ranking`, as a boolean mask [rows, experts]."""
    mask = np.zeros(ranked.shape, dtype=bool)
    np.put_along_axis(mask, ranked[:, :n], True, axis=-1)
    return mask


class _Misses:
    """Per MoE layer after the first: a slot pool replaying its routing, and each guess's sums of
    the pool's misses, of those the guess fetched, and of what it fetched that was not routed."""

    def __init__(self, layers: int, experts: int, share: float):
        from streamer.cache.policies import SlotLFU

        slots = max(1, round(share * experts))
        self.pools = [SlotLFU(slots, experts) for _ in range(layers)]
        self.sums = {}  # (guess, n, layer) -> [misses, covered, extra]

    def held(self, layer: int, routed: np.ndarray) -> np.ndarray:
        """Which experts the layer's pool held before each token's call [tokens, experts], as
        the pool replays the tokens' routing in order."""
        pool, held = self.pools[layer], np.zeros_like(routed)
        for t, row in enumerate(routed):
            held[t] = pool.slot_of >= 0
            pool.assign(np.flatnonzero(row))
        return held

    def add(self, key: tuple, guess: np.ndarray, truth: np.ndarray, held: np.ndarray) -> None:
        fetched = guess & ~held
        sums = self.sums.setdefault(key, [0, 0, 0])
        sums[0] += int((truth & ~held).sum())
        sums[1] += int((fetched & truth).sum())
        sums[2] += int((fetched & ~truth).sum())


def recalls(model: nn.Module, windows: list[np.ndarray], pool_share: float = 0.25) -> dict:
    """Per MoE layer after the first, each guess's mean recall with k and 2k guesses, over every
    token of `windows` (the previous-token guess from each window's second token), and its
    `covers` and `extra` beside a pool of `pool_share` of the layer's experts (the module's)."""
    layers = router_layers(model)
    misses = _Misses(len(layers) - 1, layers[0].mlp.gate.weight.shape[0], pool_share)
    after_attention = [_Inputs() for _ in layers]  # post_attention_layernorm's input
    before_attention = [_Inputs() for _ in layers]  # input_layernorm's input: the layer's input
    for layer, a, b in zip(layers, after_attention, before_attention):
        layer.post_attention_layernorm = _Seen(layer.post_attention_layernorm, a)
        layer.input_layernorm = _Seen(layer.input_layernorm, b)
    hits = {(g, n): [[] for _ in layers[1:]] for g in GUESSES for n in ("k", "2k")}
    try:
        for window in windows:
            for seen in (*after_attention, *before_attention):
                seen.inputs.clear()
            with recording_routing(model, prefill=True) as trace:
                mx.eval(model(mx.array(window[None])))
            _score(layers, after_attention, before_attention, trace, hits, misses)
    finally:
        for layer in layers:
            layer.post_attention_layernorm = layer.post_attention_layernorm.inner
            layer.input_layernorm = layer.input_layernorm.inner
    result = {
        f"{g} {n}": [float(np.concatenate(layer).mean()) for layer in per_layer]
        for (g, n), per_layer in hits.items()
    }
    for g, n in hits:
        sums = [misses.sums[g, n, j] for j in range(len(layers) - 1)]
        result[f"{g} {n} covers"] = [covered / max(1, m) for m, covered, _ in sums]
        result[f"{g} {n} extra"] = [extra / max(1, m) for m, _, extra in sums]
    return result


def _score(layers, after_attention, before_attention, trace, hits, misses: _Misses) -> None:
    """One window's recalls into `hits`, and each guess's misses fetched into `misses`; its true
    routing checked against `trace`."""
    k = layers[0].mlp.top_k
    for j, layer in enumerate(layers):
        router = layer.mlp.gate
        norm = layer.post_attention_layernorm.inner
        own = ranking(router(norm(after_attention[j].inputs[0][0])))
        routed = top(own, k)
        recorded = np.zeros_like(routed)
        for t, experts in enumerate(e for moe_layer, e in trace if moe_layer == j):
            recorded[t, list(experts)] = True
        if not np.array_equal(routed, recorded):  # ties aside, the rebuild must be the routing
            agree = (routed & recorded).sum() / recorded.sum()
            if agree < 0.999:
                raise StreamerError(f"layer {j}: rebuilt routing agrees on only {agree:.3%}")
        if j == 0:
            continue
        guesses = {  # each guess's ranking, and the routing it is scored against
            "early": (ranking(router(norm(after_attention[j - 1].inputs[0][0]))), routed),
            "late": (ranking(router(norm(before_attention[j].inputs[0][0]))), routed),
            "previous token": (own[:-1], routed[1:]),
        }
        held = misses.held(j - 1, routed)
        for n, count in (("k", k), ("2k", 2 * k)):
            for guess, (ranked, truth) in guesses.items():
                guessed = top(ranked, count)
                hits[guess, n][j - 1].append((guessed & truth).sum(-1) / k)
                misses.add((guess, n, j - 1), guessed, truth, held[-len(truth) :])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", type=Path, default=DEMO_MODEL, help="mlx-lm or HF checkpoint")
    ap.add_argument("--text", type=Path, help="text to route (default: the demo's held-out files)")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=128, help="window length (the demo trained on 128)")
    ap.add_argument("--pool-share", type=float, default=0.25, help="of a layer's experts")
    ap.add_argument("--out", type=Path, help="write the recalls as JSON here")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # long texts are windowed below
    from mlx_lm.utils import load

    try:
        model, tokenizer = load(str(args.model))
        model.set_dtype(mx.float32)  # the CPU backend's gather_mm is float32-only
        text = args.text.read_text(encoding="utf-8", errors="replace") if args.text else None
        tokens = np.array(tokenizer.encode(text or held_out_text()), dtype=np.int32)
        tokens = tokens[: args.max_tokens]
        windows = [tokens[i : i + args.seq] for i in range(0, len(tokens) - 1, args.seq)]
        if not 0 < args.pool_share < 1:
            raise StreamerError(f"--pool-share must lie between 0 and 1, not {args.pool_share}")
        result = recalls(model, [w for w in windows if len(w) > 1], args.pool_share)
    except (StreamerError, OSError) as error:
        raise SystemExit(f"error: {error}") from None
    k = router_layers(model)[0].mlp.top_k
    print(f"{args.model}: {len(tokens):,} tokens in windows of {args.seq}; recall of top-{k}")
    print(f"{'guess':<26}" + "".join(f"layer {j + 2:<4}" for j in range(len(result["early k"]))))
    for name, per_layer in result.items():
        print(f"{name:<26}" + "".join(f"{r:<10.3f}" for r in per_layer))
    if args.out:
        args.out.write_text(json.dumps({"model": str(args.model), "tokens": len(tokens), **result}))


if __name__ == "__main__":
    main()
