"""The training loss of a MoE trained from scratch: cross entropy plus the Switch Transformer
load-balancing term, over the router logits each layer's gate records."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class RecordingGate(nn.Linear):
    """The router, also keeping its logits so the loss can add a load-balancing term.

    Without one, a router trained from scratch collapses onto a few experts: real MoEs (and this
    demo) train with the Switch Transformer auxiliary loss.
    """

    logits: list = []

    def __call__(self, x: mx.array) -> mx.array:
        y = super().__call__(x)
        RecordingGate.logits.append(y)
        return y


def install_recording_gates(model: nn.Module) -> None:
    """Swap each router for a RecordingGate with the same weight (parameter names unchanged)."""
    for layer in model.model.layers:
        moe = layer.mlp
        gate = RecordingGate(moe.gate.weight.shape[1], moe.gate.weight.shape[0], bias=False)
        gate.weight = moe.gate.weight
        moe.gate = gate


def balance_loss(logits: mx.array, top_k: int) -> mx.array:
    """num_experts * sum_e (share of routed slots to e) * (mean router probability of e)."""
    n = logits.shape[-1]
    probs = mx.softmax(logits.reshape(-1, n), axis=-1)
    chosen = mx.argpartition(-probs, kth=top_k - 1, axis=-1)[:, :top_k]
    counts = mx.zeros((n,)).at[chosen.reshape(-1)].add(1.0)
    share = mx.stop_gradient(counts / chosen.size)
    return n * mx.sum(share * probs.mean(axis=0))


def loss_fn(
    model: nn.Module, x: mx.array, y: mx.array, aux_weight: float
) -> tuple[mx.array, mx.array]:
    RecordingGate.logits = []
    logits = model(x)
    ce = nn.losses.cross_entropy(logits, y, reduction="mean")
    k = model.args.num_experts_per_tok
    aux = sum(balance_loss(g, k) for g in RecordingGate.logits) / len(RecordingGate.logits)
    return ce + aux_weight * aux, ce
