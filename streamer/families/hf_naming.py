"""How each family's Hugging Face checkpoints name their expert tensors: the one thing about
experts that differs per family and that mlx-lm's model cannot tell the repacker (a naming
convention is data here, not a branch in the engine)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Architecture:
    """How a family's Hugging Face checkpoints name their per-expert tensors: the one thing about
    experts that differs per family and that mlx-lm's model cannot tell the repacker. Everything
    else (fused layouts, FP8, expert biases, activations) comes from the model's own `sanitize` and
    expert container."""

    # HF per-expert projection name -> the expert container's projection name
    hf_projections: dict[str, str] = field(default_factory=lambda: dict(_GLU))
    # the per-expert list under the MoE block: `{block}.{hf_experts}.{e}.{projection}.{kind}`
    hf_experts: str = "experts"
    # the MoE block's own name in HF checkpoints where mlx-lm names it otherwise (`mlp`)
    hf_block: str | None = None
    # (mlx-lm's, the checkpoint's) spellings in the block's path, for a family whose checkpoints
    # use names of their own throughout (DeepSeek-V4.1's `layers.{l}.ffn`)
    hf_path_spellings: tuple[tuple[str, str], ...] = ()
    # fused tensors (names containing one of these) whose first axis holds each expert's rows one
    # after another (DBRX's `experts.mlp.w1` [E*F, D]): read as [E, F, D]
    hf_expert_rows: tuple[str, ...] = ()
    # (mlx-lm's, transformers 5's) spellings of the block's path's start where transformers'
    # save writes one of its own beside the published one (Kimi K2.5's text `blocks.{l}`)
    hf_transformers_spellings: tuple[tuple[str, str], ...] = ()

    def hf_parent(self, container: str) -> str:
        """The HF name of the MoE block that holds `container` (an expert container's path)."""
        block = container.rsplit(".", 1)[0]
        if self.hf_block is not None:
            block = f"{block.rsplit('.', 1)[0]}.{self.hf_block}"
        for ours, theirs in self.hf_path_spellings:
            block = block.replace(ours, theirs)
        return block

    def hf_parents(self, container: str) -> tuple[str, ...]:
        """`hf_parent`, and its spellings in checkpoints that transformers 5 writes: vision-language
        ones' `model.language_model.` for mlx-lm's `language_model.model.` (`model.` where it
        saves the text model alone: Qwen3.5-MoE's for AutoModelForCausalLM), and the family's
        `hf_transformers_spellings`."""
        block = self.hf_parent(container)
        spellings = (
            ("language_model.model.", "model.language_model."),
            ("language_model.model.", "model."),
        )
        theirs = [
            their + block[len(ours) :]
            for ours, their in spellings + self.hf_transformers_spellings
            if block.startswith(ours)
        ]
        return (block, *theirs)


_GLU = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}
_W123 = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
# Families whose HF checkpoints name experts otherwise than `experts.{e}.{gate,up,down}_proj`.
NAMING: dict[str, Architecture] = {
    "mixtral": Architecture(_W123),
    "minimax": Architecture(_W123),
    "minimax_m3_vl": Architecture(_W123),
    "phimoe": Architecture(_W123),
    "lfm2_moe": Architecture(_W123),
    "kimi_linear": Architecture(_W123, hf_block="block_sparse_moe"),
    "kimi_k3": Architecture(_W123, hf_block="block_sparse_moe"),
    "nemotron_h": Architecture({"up_proj": "fc1", "down_proj": "fc2"}),
    "phixtral": Architecture({"fc1": "fc1", "fc2": "fc2"}, hf_experts="mlp"),
    # mlx_lm.convert's per-expert MLPs (expert_lists.py stacks them under `ffn.switch_mlp`); the
    # hub's fused `ffn.experts.mlp.*` hold each expert's rows one after another
    "dbrx": Architecture(
        {"w1": "gate_proj", "v1": "up_proj", "w2": "down_proj"}, hf_expert_rows=("experts.mlp.",)
    ),
    # transformers 5.24 saves Kimi K2.5's text layers as `blocks` (repack/layouts.py)
    "kimi_k25": Architecture(
        hf_transformers_spellings=(
            ("language_model.model.layers.", "language_model.model.blocks."),
        )
    ),
    # DeepSeek's own names: `layers.{l}.ffn.experts.{e}.w1` for mlx-lm's
    # `model.layers.{l}.mlp.experts.switch_mlp.gate_proj`
    "deepseek_v41": Architecture(
        _W123, hf_path_spellings=(("model.layers.", "layers."), (".mlp.experts", ".ffn"))
    ),
}


# `{parent}.{experts}.{e}.{projection}.{kind}`: the Hugging Face per-expert convention.
def hf_expert_key(arch: Architecture) -> re.Pattern:
    return re.compile(
        rf"^(?P<parent>.+)\.{re.escape(arch.hf_experts)}\.(?P<expert>\d+)\."
        r"(?P<proj>[^.]+)\.(?P<kind>[^.]+)$"
    )
