"""RoPE scaling that config.json asks for and mlx-lm's model for it does not apply.

Some of mlx-lm's models build a plain `nn.RoPE` whatever `rope_scaling` says (Qwen3-MoE,
Mixtral, GLM-4.5, ERNIE 4.5, MiniMax-M2, LFM2: they take the field and never read it), where
transformers scales the frequencies (YaRN, linear, Llama 3): the logits differ at every position
(1 to 8 on the tiny models); DeepSeek-V2's computes YaRN whatever the type. A config that asks
for it is refused with the reason; the published configs of these families ask for none. Found
in the built model, not listed: a RoPE of another class than `nn.RoPE`, or one with a scale,
applies it.
"""

from __future__ import annotations

from pathlib import Path

import mlx.nn as nn

from ..errors import StreamerError

# mlx-lm model file -> the rope_scaling types its own RoPE computes, where it computes one kind
# whatever the type says (DeepSeek-V2's YaRN)
OWN_SCALING: dict[str, tuple[str, ...]] = {"deepseek_v2": ("yarn", "deepseek_yarn")}


def scaling_type(config: dict) -> str | None:
    """The rope_scaling type config.json asks for (a vision-language model's text model's), None
    for plain RoPE."""
    for values in (config, config.get("text_config")):
        scaling = values.get("rope_scaling") if isinstance(values, dict) else None
        if isinstance(scaling, dict):
            kind = scaling.get("type") or scaling.get("rope_type") or "default"
            context = values.get("max_position_embeddings")
            trained = scaling.get("original_max_position_embeddings", context)
            if kind == "dynamic" and type(trained) is int and type(context) is int:
                # NTK scaling past the trained context only, which no prompt reaches (generate
                # refuses one past max_position_embeddings): plain RoPE within it
                return None if trained >= context else str(kind)
            return None if kind == "default" else str(kind)
    return None


def refuse_ignored_rope_scaling(model: nn.Module, config: dict, where: Path | str) -> None:
    kind = scaling_type(config)
    if kind is None:
        return
    ropes = [
        module
        for _, module in model.named_modules()
        if isinstance(module, nn.RoPE) or type(module).__name__.endswith(("RoPE", "Rotary"))
    ]
    family = type(model).__module__.rsplit(".", 1)[1]
    if family in OWN_SCALING and kind not in OWN_SCALING[family]:
        raise StreamerError(
            f"{where}: rope_scaling {kind!r}: mlx-lm's {family} model computes "
            f"{OWN_SCALING[family][0]!r} scaling whatever the type says, transformers {kind!r}: "
            "mlx-lm computes this config otherwise."
        )
    if not ropes or any(not isinstance(r, nn.RoPE) or r.scale != 1.0 for r in ropes):
        return  # no RoPE at all, or one that applies the scaling
    raise StreamerError(
        f"{where}: rope_scaling {kind!r} (rope_parameters in transformers' spelling) is not "
        f"applied by mlx-lm's {family} model, which computes plain RoPE whatever it says, while "
        "transformers scales the frequencies: mlx-lm computes this config otherwise. Remove the "
        "scaling from config.json to run the model as mlx-lm does."
    )
