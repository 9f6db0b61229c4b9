"""Models whose experts are a list of per-expert MLPs (DBRX), built with the list stacked into one
SwitchGLU, so that they stream as every Switch family does.

mlx-lm's DBRX computes its experts token by token from `ffn.experts[e]` (`w1`, `v1`, `w2`); this
model routes exactly as mlx-lm's `SparseMoeBlock` does (softmax router in float32, top-k, scores
L1-normalized) and calls a SwitchGLU with gate = `w1`, up = `v1`, down = `w2` (SwiGLU, as
mlx-lm's MLP), under `ffn.switch_mlp`. Its sanitize stacks both conventions into those names:
Hugging Face's fused `ffn.experts.mlp.{w1,v1,w2}` ([E*F, D] each, `w2` transposed per expert) and
`mlx_lm.convert`'s per-expert `ffn.experts.{e}.{w1,v1,w2}.{weight,scales,biases}`.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError
from .hf_naming import NAMING
from .mlx_lm_models import models_without_package_init

with models_without_package_init():
    from mlx_lm.models import dbrx
    from mlx_lm.models.switch_layers import SwitchGLU

# DBRX's projection -> SwitchGLU's
DBRX_PROJECTIONS = NAMING["dbrx"].hf_projections


class SwitchMoeBlock(nn.Module):
    """DBRX's `SparseMoeBlock` with its experts in a SwitchGLU."""

    def __init__(self, args: dbrx.ModelArgs):
        super().__init__()
        ffn = args.ffn_config
        self.num_experts_per_tok = ffn["moe_top_k"]
        self.router = dbrx.Router(args.d_model, ffn["moe_num_experts"])
        self.switch_mlp = SwitchGLU(args.d_model, ffn["ffn_hidden_size"], ffn["moe_num_experts"])

    def __call__(self, x: mx.array) -> mx.array:
        k = self.num_experts_per_tok
        gates = mx.softmax(self.router(x).astype(mx.float32), axis=-1)
        inds = mx.stop_gradient(mx.argpartition(-gates, kth=k - 1, axis=-1)[..., :k])
        scores = mx.take_along_axis(gates, inds, axis=-1)
        scores = scores / mx.linalg.norm(scores, ord=1, axis=-1, keepdims=True)
        y = self.switch_mlp(x, inds)  # [..., k, D]
        return (y * scores.astype(x.dtype)[..., None]).sum(axis=-2)


class Model(dbrx.Model):
    """mlx-lm's DBRX with each layer's `ffn` a SwitchMoeBlock."""

    def __init__(self, args: dbrx.ModelArgs):
        super().__init__(args)
        for block in self.transformer.blocks:
            block.ffn = SwitchMoeBlock(args)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Expert tensors in SwitchGLU's stacked names; the others as they are (mlx-lm's own
        sanitize changes nothing else). Fused tensors may hold any number of experts' rows (one
        expert's slice, when the repacker asks)."""
        rows = self.args.ffn_config["ffn_hidden_size"]
        num_experts = self.args.ffn_config["moe_num_experts"]
        out: dict[str, mx.array] = {}
        per_expert: dict[tuple[str, str, str], dict[int, mx.array]] = {}
        for name, value in weights.items():
            block, found, leaf = name.partition(".experts.")
            parts = leaf.split(".")
            if found and len(parts) == 2 and parts[0] == "mlp" and parts[1] in DBRX_PROJECTIONS:
                stacked = value.reshape(-1, rows, value.shape[-1])
                if parts[1] == "w2":
                    stacked = mx.swapaxes(stacked, -1, -2)
                out[f"{block}.switch_mlp.{DBRX_PROJECTIONS[parts[1]]}.weight"] = stacked
            elif found and len(parts) == 3 and parts[0].isdigit() and parts[1] in DBRX_PROJECTIONS:
                per_expert.setdefault((block, parts[1], parts[2]), {})[int(parts[0])] = value
            else:
                out[name] = value
        for (block, proj, kind), experts in per_expert.items():
            missing = next((e for e in range(num_experts) if e not in experts), None)
            if missing is not None:
                raise StreamerError(
                    f"tensor '{block}.experts.{missing}.{proj}.{kind}' is missing: the download "
                    "is incomplete."
                )
            out[f"{block}.switch_mlp.{DBRX_PROJECTIONS[proj]}.{kind}"] = mx.stack(
                [experts[e] for e in range(num_experts)]
            )
        return out


# mlx-lm model file -> the model streamer builds for it instead: its expert list stacked
STACKED_MODELS: dict[str, type[nn.Module]] = {"dbrx": Model}
