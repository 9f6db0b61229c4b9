"""Fields a config.json leaves out (or nulls) where no value is both what transformers computes and
what the model's own code and mlx-lm compute, or where neither default is the published models':
refused with the reason, since no fill (defaults.py) nor mlx-lm's default is right. Checked on
config.json and on a vision-language model's text_config, by the model_type transformers reads
each as.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...errors import StreamerError
from .defaults import MISTRAL4_YARN, own_model_type, text_model_type

# what Mistral 4's attention reads from its RoPE settings to scale the queries by position
MISTRAL4_QUERY_SCALING = ("llama_4_scaling_beta", "original_max_position_embeddings")


def _step3p5_window(config: dict) -> str | None:
    """Left out, Step-3.5's window is none to transformers (its model raises at a sliding layer)
    and 512 to mlx-lm (the published config.json's; sglang's notes say 128), and its layer_types
    all full attention to transformers and every even layer sliding to mlx-lm (the published
    config lists 3 sliding layers to each full one): no value is both's. A null window is a
    window only where no layer slides."""
    kinds, layers = config.get("layer_types"), config.get("num_hidden_layers")
    if isinstance(kinds, list):
        sliding, how = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"], ""
    else:  # mlx-lm's step3p5 without layer_types: every even layer slides
        sliding = list(range(0, layers, 2)) if type(layers) is int else [0]
        how = " (mlx-lm slides every even layer without layer_types)"
    if sliding and config.get("sliding_window") is None:
        return _no_window(sliding, how, "null" if "sliding_window" in config else "left out")
    if kinds is None:
        return (
            f"layer_types is {'null' if 'layer_types' in config else 'left out'}: "
            "transformers' step3p5 then makes every layer full "
            "attention, mlx-lm slides every even layer, the published models 3 layers of 4; add "
            "the published layer_types to config.json."
        )
    return None


def _no_window(sliding: list[int], how: str, said: str) -> str:
    shown = ", ".join(map(str, sliding[:4]))
    shown += f" ... ({len(sliding)} layers)" if len(sliding) > 4 else ""
    defaults = (
        "transformers' step3p5 then has none and its model raises, mlx-lm slides over 512 "
        "tokens, the published config.json's window"
        if said == "left out"
        else "transformers' step3p5 model raises without one, mlx-lm's cannot cache one"
    )
    return (
        f"sliding_window is {said}, but layers {shown} are sliding_attention{how}: a sliding "
        f"layer needs its window ({defaults}); set sliding_window to the model's window, as its "
        "published config.json says."
    )


def _mimo_value_scale(config: dict) -> str | None:
    """transformers' MiMo-V2-Flash scales the attention values by 0.707 where the field is left
    out, the hub's own code (and mlx-lm) by 1: the published configs all say 0.707."""
    if "attention_value_scale" in config:
        return None  # a number both compute; null is no scaling to both
    return (
        "attention_value_scale is left out: transformers' mimo_v2_flash then scales the attention "
        "values by 0.707 (its default, the published models' value), MiMo's own code and mlx-lm "
        'by 1; add "attention_value_scale": 0.707 to config.json as published (null: no scaling).'
    )


def _hunyuan_rope(config: dict) -> str | None:
    """mlx-lm's hunyuan takes its RoPE's NTK alpha from rope_scaling (it failed to build without
    one); transformers' Hunyuan (hunyuan_v1_moe) then computes plain RoPE."""
    if config.get("rope_scaling") is not None:
        return None
    return (
        f"rope_scaling is {'null' if 'rope_scaling' in config else 'left out'}: mlx-lm's hunyuan "
        "model then fails to build (it reads the NTK alpha there), transformers' Hunyuan computes "
        'plain RoPE, the published Hunyuan-A13B {"type": "dynamic", "alpha": 1000.0, ...}; add '
        "the published rope_scaling to config.json."
    )


def _gemma4_softcap(config: dict) -> str | None:
    if "final_logit_softcapping" in config:
        return None
    return (
        "final_logit_softcapping is left out: transformers' gemma4 then caps no logits, mlx-lm "
        'at 30.0 (the published models\' value); add "final_logit_softcapping": 30.0 to '
        "config.json as published (null: no cap)."
    )


def _gemma4_text(config: dict) -> str | None:
    """Its logit cap; its routed experts per token, which neither transformers' config class nor
    mlx-lm's model args give a default (mlx-lm's None raised a TypeError at the first token); and
    its last layer, which transformers makes full attention whatever layer_types says."""
    kinds = config.get("layer_types")
    if isinstance(kinds, list) and kinds and kinds[-1] != "full_attention":
        return (
            f"layer_types ends in {kinds[-1]!r}: transformers' gemma4 makes the last layer "
            "full attention whatever layer_types says, mlx-lm computes it as given; end "
            "layer_types in full_attention, as the published config.json does."
        )
    if config.get("num_experts") and "top_k_experts" not in config:
        return (
            f"top_k_experts is left out, but num_experts is {config['num_experts']}: neither "
            "transformers' gemma4 nor mlx-lm has a default for the experts a token routes to; "
            "add the published top_k_experts to config.json."
        )
    return _gemma4_softcap(config)


def _qwen3_5_rope(config: dict) -> str | None:
    if "rope_parameters" in config or "rope_theta" in config:
        return None  # a rope_theta alone is read into rope_parameters (defaults.READ_FROM)
    return (
        "rope_parameters is left out: transformers' qwen3_5_moe_text then computes RoPE with base "
        "10000, mlx-lm with 100000, the published models with 10000000; add the published "
        "rope_parameters to config.json."
    )


def _mistral4_llama_4_scaling(config: dict) -> str | None:
    """Mistral 4 scales its queries by rope_parameters' llama_4_scaling_beta and
    original_max_position_embeddings: transformers' model and mlx-lm's fail without them (a
    TypeError, a KeyError), and the fill (defaults.py) is transformers' only where no RoPE
    settings are given."""
    given = "rope_parameters" if "rope_parameters" in config else "rope_scaling"
    rope = config.get(given)
    if not isinstance(rope, dict):
        return None  # left out: filled; another value: check_common_fields names it
    lacking = [k for k in MISTRAL4_QUERY_SCALING if k not in rope]
    if not lacking:
        return None
    return (
        f"{given} has no {' or '.join(lacking)}: Mistral 4 scales its queries by them "
        "(transformers' and mlx-lm's models fail without them); add them as the published "
        f"rope_parameters give them ({', '.join(f'{k}: {MISTRAL4_YARN[k]}' for k in lacking)})."
    )


def _mellum_rope(config: dict) -> str | None:
    """Mellum keeps one RoPE per layer kind in rope_parameters, and transformers reads
    rope_scaling (transformers 4's spelling) as them, as given: settings with no entry for a
    layer kind its layers use fail in transformers' model and mlx-lm's (a KeyError), and a linear
    one with a factor is scaled by transformers only."""
    given = "rope_parameters" if config.get("rope_parameters") is not None else "rope_scaling"
    rope, kinds = config.get(given), config.get("layer_types")
    if not isinstance(rope, dict) or not isinstance(kinds, list):
        return None  # left out or null: filled (defaults.py); another value: checked elsewhere
    lacking = sorted(  # another kind's or a list's fault is checked elsewhere
        {
            k
            for k in kinds
            if isinstance(k, str)
            and (not isinstance(rope.get(k), dict) or "rope_theta" not in rope[k])
        }
    )
    scaled = sorted(  # mlx-lm's mellum takes "linear" for plain RoPE: no factor
        k
        for k, v in rope.items()
        if isinstance(v, dict) and v.get("rope_type") == "linear" and v.get("factor", 1) != 1
    )
    if scaled:
        return (
            f"{given}'s {scaled[0]!r} entry is linear RoPE with factor "
            f"{rope[scaled[0]].get('factor')!r}: transformers divides the positions by it, "
            "mlx-lm's mellum computes plain RoPE and ignores it; give rope_parameters as the "
            "published config.json does."
        )
    if not lacking:
        return None
    return (
        f"{given} has no {' or '.join(map(repr, lacking))} entry with a rope_theta: Mellum "
        f"computes one RoPE per layer kind from them (transformers reads {given} as its "
        "rope_parameters; its model and mlx-lm's fail without one); give rope_parameters as "
        "the published config.json does."
    )


def _minimax_m3_rotary(config: dict) -> str | None:
    """transformers' MiniMax-M3 rotates rope_parameters' share of the head (all of it where none
    is given) and never reads rotary_dim; mlx-lm's rotates rotary_dim dims, else its share of the
    head (half where none is given, as published)."""
    rope = config.get("rope_parameters")
    share = (rope if isinstance(rope, dict) else {}).get(
        "partial_rotary_factor", config.get("partial_rotary_factor")
    )
    rotary, head = config.get("rotary_dim"), config.get("head_dim")
    if share is None and rotary is None:
        return (
            "rope_parameters has no partial_rotary_factor: transformers' minimax_m3_vl then "
            "rotates all of each head, mlx-lm half of it (the published models' 0.5); add the "
            "published rope_parameters to config.json."
        )
    if rotary is None or type(head) is not int or not isinstance(share or 1.0, (int, float)):
        return None
    rotated = int(head * (1.0 if share is None else share))
    if rotary == rotated:
        return None
    return (
        f"rotary_dim is {rotary}, but rope_parameters' share of the {head}-dim head is {rotated} "
        f"dims: transformers' minimax_m3_vl rotates those {rotated} (it reads no rotary_dim), "
        f"mlx-lm {rotary}; make them agree as the published config.json does."
    )


# model_type -> why a config that leaves out (or nulls) a field cannot be computed as the
# published model means, by filling or by mlx-lm's default (None: it can)
UNFILLED: dict[str, Callable[[dict], str | None]] = {
    "step3p5": _step3p5_window,
    "mimo_v2_flash": _mimo_value_scale,
    "gemma4_text": _gemma4_text,
    "qwen3_5_moe_text": _qwen3_5_rope,
    "mistral4": _mistral4_llama_4_scaling,
    "minimax_m3_vl_text": _minimax_m3_rotary,
    "mellum": _mellum_rope,
    "hunyuan": _hunyuan_rope,
}


def refuse_unfilled(config: dict, where: Path | str) -> None:
    """Refuse `config` where UNFILLED says no value of a field it leaves out is the model's, in
    a vision-language model's text_config (or its flat config) too."""
    text = config.get("text_config")
    for values, kind, prefix in (
        (config, own_model_type(config), ""),
        (text, text_model_type(config), "text_config."),
    ):
        check = UNFILLED.get(kind) if isinstance(values, dict) else None
        reason = check(values) if check is not None else None
        if reason is not None:
            raise StreamerError(f"{where}: {prefix}{reason}")
