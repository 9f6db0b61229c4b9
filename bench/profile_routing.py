"""The routing model (routing_model.py) in place of every MoE layer's router: bench/worker.py
--routing PROFILE.

Each MoE block's `gate` (the router's linear layer) is replaced by ProfileGate, whose logits are
a seeded score at the profile's experts for that (layer, token position) and -1e4 elsewhere: the
block's own softmax and top-k then pick exactly those experts, weighted by the softmax of those
scores, and hand them to its expert container as usual. Nothing past the router changes: mlx-lm's
SwitchGLU and streamer's StreamingExperts (whatever read path) get the same indices for the same
position, so both engines compute the same tokens through the same experts. The router's own
matmul is skipped in both, but its logits still depend on the hidden state (mx.depends), so the
routing sync waits for what a real router's would.

Positions count from each prompt's first token (`start`): a call of T tokens (a prompt chunk, a
decode step) takes the next T positions of its layer.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from routing_model import RoutingModel

OFF = -1e4  # logit of an expert not routed: exp underflows to 0 in every float dtype


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's MoE blocks in layer order: modules with a `gate` router beside a
    `switch_mlp` expert container (mlx-lm's qwen3_moe and its kin; streamer keeps the block)."""
    found = [
        (path, m)
        for path, m in model.named_modules()
        if isinstance(m, nn.Module) and "gate" in m and "switch_mlp" in m
    ]
    found.sort(key=lambda item: [int(t) if t.isdigit() else t for t in item[0].split(".")])
    if not found:
        raise SystemExit(
            "--routing: this model has no MoE block with a `gate` router beside a `switch_mlp`; "
            "the routing model replaces those only (qwen3_moe-style blocks)"
        )
    return [m for _, m in found]


class Positions:
    """A prompt's router logits per layer, and how many positions each layer has used."""

    def __init__(self, model: RoutingModel):
        self.model = model
        self.logits: list[mx.array] = []
        self.used: list[int] = []

    def start(self, prompt: int, tokens: int) -> None:
        """Prompt `prompt` begins: logits for its first `tokens` positions ([tokens, experts]
        per layer), the profile's experts at seeded N(0, 1) scores."""
        routed = self.model.prompt(prompt, tokens)  # [tokens, layers, k]
        scores = np.random.default_rng([self.model.seed, 2, prompt]).standard_normal(routed.shape)
        logits = np.full((tokens, self.model.layers, self.model.experts), OFF, dtype=np.float32)
        np.put_along_axis(logits, routed, scores.astype(np.float32), axis=2)
        self.logits = [mx.array(logits[:, layer]) for layer in range(logits.shape[1])]
        mx.eval(self.logits)
        self.used = [0] * len(self.logits)

    def take(self, layer: int, count: int) -> mx.array:
        first = self.used[layer]
        if first + count > self.logits[layer].shape[0]:
            raise SystemExit(
                f"--routing: layer {layer} asked for position {first + count - 1}, past the "
                f"{self.logits[layer].shape[0]} positions its prompt was started with"
            )
        self.used[layer] = first + count
        return self.logits[layer][first : first + count]


class ProfileGate(nn.Module):
    """A router whose logits come from the routing model: x [B, T, D] -> [B, T, experts]."""

    def __init__(self, positions: Positions, layer: int):
        super().__init__()
        object.__setattr__(self, "_positions", positions)  # shared, not a child module
        self._layer = layer

    def __call__(self, x: mx.array) -> mx.array:
        if x.ndim != 3 or x.shape[0] != 1:
            raise SystemExit(f"--routing: one sequence at a time (router input {x.shape})")
        logits = self._positions.take(self._layer, x.shape[1])[None]
        logits = logits if logits.dtype == x.dtype else logits.astype(x.dtype)
        # A real router's logits are computed from x, so the engine's host sync for the routing
        # waits for x (attention, the previous layer's experts); these are not, and without the
        # dependency that wait would land in whatever waits next (the read path's fence) and let
        # reads start before the previous layers compute. The values are untouched.
        return mx.depends(logits, x)


def install(model: nn.Module, profile: str, seed: int = 0) -> Positions:
    """Every MoE block's gate replaced by the profile's routing; the caller `start`s each prompt."""
    blocks = moe_blocks(model)
    experts = blocks[0].gate.weight.shape[0]
    top_k = getattr(blocks[0], "top_k", None) or blocks[0].num_experts_per_tok
    positions = Positions(RoutingModel(profile, experts, top_k, len(blocks), seed))
    for layer, block in enumerate(blocks):
        block.gate = ProfileGate(positions, layer)
    return positions
