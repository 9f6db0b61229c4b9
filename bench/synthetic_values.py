"""Random values by parameter name, with synthetic routing.

Routing is synthetic, calibrated to two published statistics (bench/README.md, "The models"):
- skew (how popular the popular experts are): each router row (one per expert) is scaled by
  exp(skew * z_e), z_e ~ N(0, 1) drawn per layer. The router input is RMS-normalised, so a larger
  row means a wider logit spread and more top-k wins. skew=0 is uniform.
- reuse (consecutive tokens sharing experts): the vocabulary is split into TOPICS topics (token t
  in topic t % TOPICS) and every token's embedding shares its topic's random direction (a
  `topic_share` of its variance), so tokens of one topic route alike. The output projection
  gives each topic's tokens a logit boost of `stickiness` x the current token's topic component,
  so sampled text stays in a topic for a while and then moves on. topic_share=0 and
  stickiness=0 give independent tokens (reuse k/E plus what skew alone causes).
"""

from __future__ import annotations

import math
import zlib

import mlx.core as mx
import numpy as np

CHUNK_ELEMENTS = 1 << 26  # floats generated per step (256 MB of float32)
TOPICS = 64


class RandomValues:
    """Random values by parameter name. A quantized module's weight/scales/biases come from one
    mx.quantize of random floats, kept only until all three are written."""

    def __init__(self, specs: list, qconfig: dict, dtype: mx.Dtype, routing: dict, seed: int):
        self.quant = qconfig["quantization"]
        self.dtype = dtype
        self.routing, self.seed = routing, seed
        hidden = next(shape[-1] for name, shape, _ in specs if name == "model.norm.weight")
        topic_rng = np.random.default_rng([seed, TOPICS])
        self.topics = mx.array(topic_rng.standard_normal((TOPICS, hidden)).astype(np.float32))
        self.shapes = {name: shape for name, shape, _ in specs}
        self.quantized = {
            name.rsplit(".", 1)[0] for name, _, _ in specs if name.endswith(".scales")
        }
        self.pending: dict[str, dict[str, mx.array]] = {}

    def take(self, name: str) -> mx.array:
        module, kind = name.rsplit(".", 1)
        if module not in self.quantized:  # norms: near 1
            values = 1.0 + 0.1 * self._rng(name).uniform(-1, 1, self.shapes[name])
            return mx.array(values.astype(np.float32)).astype(self.dtype)
        if module not in self.pending:
            self.pending[module] = self._quantize(module)
        parts = self.pending[module]
        array = parts.pop(kind)
        if not parts:
            del self.pending[module]
        return array

    def _quantize(self, module: str) -> dict[str, mx.array]:
        params = self.quant.get(module, self.quant)
        gs, bits = params["group_size"], params["bits"]
        packed = self.shapes[f"{module}.weight"]
        shape = (*packed[:-1], packed[-1] * 32 // bits)  # the float weight's shape
        rng = self._rng(module)
        std = 1.0 if module.endswith("embed_tokens") else 1.0 / math.sqrt(shape[-1])
        bound = math.sqrt(3) * std  # uniform(-bound, bound) has this std
        rows = None
        if module.endswith("mlp.gate"):  # the router: popular experts get a wider logit spread
            rows = mx.array(
                np.exp(self.routing["skew"] * rng.standard_normal((shape[0], 1))).astype(np.float32)
            )
        # Chunks along the leading axis (experts, or rows) keep the float32 copy small.
        step = max(1, CHUNK_ELEMENTS // math.prod(shape[1:]))
        starts = range(0, shape[0], step)
        keys = mx.random.split(mx.random.key(int(rng.integers(1 << 62))), len(starts))
        chunks = []
        for key, lo in zip(keys, starts):
            floats = mx.random.uniform(
                -bound, bound, (min(step, shape[0] - lo), *shape[1:]), key=key
            )
            if rows is not None:
                floats = floats * rows[lo : lo + floats.shape[0]]
            floats = self._topical(module, floats, lo)
            q = mx.quantize(floats.astype(self.dtype), gs, bits)
            mx.eval(q)
            chunks.append(q)
        out = [
            mx.concatenate(parts, axis=0) if len(parts) > 1 else parts[0] for parts in zip(*chunks)
        ]
        mx.eval(out)
        return dict(zip(("weight", "scales", "biases"), out))

    def _topical(self, module: str, floats: mx.array, lo: int) -> mx.array:
        """Token rows lo.. of the embedding or output projection with their topics mixed in."""
        if not module.endswith(("embed_tokens", "lm_head")):
            return floats
        topic = self.topics[mx.arange(lo, lo + floats.shape[0]) % TOPICS]
        if module.endswith("embed_tokens"):  # std 1 per entry; the topic takes its share
            share = self.routing["topic_share"]
            return math.sqrt(share) * topic + math.sqrt(1 - share) * floats
        # h . topic / hidden ~ sqrt(topic_share) for a hidden state h of the same topic
        return floats + self.routing["stickiness"] / floats.shape[-1] * topic

    def _rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])
