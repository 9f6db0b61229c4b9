"""Models that transformers 5 names otherwise than their published checkpoints (and so mlx-lm)
do: config.json as transformers' `save_pretrained` writes it for them, read as the published
config that mlx-lm's model for them reads, and what of it mlx-lm's model cannot compute."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TransformersModel:
    """How transformers writes one model's config.json, against the published one."""

    # fields the published config.json has instead (its architectures, its model_type)
    published: dict[str, object]
    # mlx-lm's field -> the one transformers writes for it (its config's attribute_map, a field
    # its config overwrites, `section.field` inside one): where transformers wrote it, it is what
    # its model computes with
    renamed: dict[str, str] = field(default_factory=dict)
    # fields whose value transformers' model fixes, whatever config.json says (or does not say):
    # field -> the value it computes with, from the config
    fixed: dict[str, Callable[[dict], object]] = field(default_factory=dict)
    # why a config that transformers' model computes with is one mlx-lm's computes otherwise
    # (None: it computes the same)
    differs: Callable[[dict], str | None] = lambda _: None
    # a vision-language model's text model saved alone, whose published config holds it as
    # text_config under `published`'s fields
    text_alone: bool = False


def _bailing_v3_differs(config: dict) -> str | None:
    layers = config.get("num_hidden_layers")
    group = config.get("layer_group_size")
    kinds = config.get("layer_types")
    if isinstance(kinds, list) and type(layers) is int and type(group) is int and group > 0:
        # mlx-lm's rule: every group's last layer and the layers after the last whole group MLA
        mla = [(i + 1) % group == 0 or i >= layers // group * group for i in range(layers)]
        if kinds != ["full_attention" if m else "linear_attention" for m in mla]:
            return (
                f"its layer_types {kinds} are not mlx-lm's bailing_moe_v3 layers, MLA the last of "
                f"every {group} (layer_group_size) and those after the last whole group."
            )
    dense = config.get("first_k_dense_replace")
    mlp = config.get("mlp_layer_types")
    if isinstance(mlp, list) and type(dense) is int:
        if mlp != ["dense" if i < dense else "sparse" for i in range(len(mlp))]:
            return f"its mlp_layer_types {mlp} are not a first_k_dense_replace={dense} prefix."
    if config.get("moe_renormalize") is False:
        return "moe_renormalize is false; mlx-lm's bailing_moe_v3 always renormalizes the top-k."
    if config.get("attention_bias"):
        return "attention_bias is true; mlx-lm's bailing_moe_v3 has no attention biases."
    if config.get("kda_safe_gate") is False:
        return "kda_safe_gate is false; mlx-lm's bailing_moe_v3 computes the bounded gate only."
    if config.get("hidden_act", "silu") != "silu":
        return f"hidden_act is {config['hidden_act']!r}; mlx-lm's bailing_moe_v3 computes SiLU."
    return None


def _llama4_moe_layers_differ(config: dict) -> str | None:
    layers, moe = config.get("num_hidden_layers"), config.get("moe_layers")
    step = config.get("interleave_moe_layer_step", 1)
    if isinstance(moe, list) and type(layers) is int and type(step) is int and step > 0:
        if moe != list(range(step - 1, layers, step)):  # transformers' moe_layers overrides it
            return (
                f"its moe_layers {moe} are not mlx-lm's llama4 MoE layers, the last of every "
                f"{step} (interleave_moe_layer_step)."
            )
    return None


# (model_type, transformers' architecture) -> how it writes that model
TRANSFORMERS_MODELS: dict[tuple[str, str], TransformersModel] = {
    # Ling 3: KDA and gated MLA layers (transformers' docs name inclusionAI/Ling-3.0-Flash), which
    # the hub names BailingMoeV3ForCausalLM and mlx-lm runs as bailing_moe_v3 (mlx-lm's
    # bailing_hybrid is Ling 2.5, BailingMoeLinearV2_5ForCausalLM). transformers' config
    # overwrites head_dim with qk_rope_head_dim (its RoPE's width) and keeps the KDA heads' in
    # linear_head_dim; its shared expert is moe_intermediate_size wide per shared expert.
    ("bailing_hybrid", "BailingHybridForCausalLM"): TransformersModel(
        published={"architectures": ["BailingMoeV3ForCausalLM"]},
        renamed={
            "num_experts_per_tok": "num_experts_per_token",
            "n_group": "num_expert_group",
            "max_position_embeddings": "model_max_length",
            "head_dim": "linear_head_dim",
            # its model's RoPE; the top-level rope_theta it also writes is unread
            "rope_theta": "rope_parameters.rope_theta",
        },
        fixed={
            "moe_shared_expert_intermediate_size": lambda c: c.get("moe_intermediate_size"),
            # it never ties its lm_head to the embeddings (no tied weights), whatever
            # tie_word_embeddings says: its save writes both
            "tie_word_embeddings": lambda _: False,
        },
        differs=_bailing_v3_differs,
    ),
    # Qwen3.5-MoE's text model alone (what AutoModelForCausalLM builds for a qwen3_5_moe config),
    # which mlx-lm's qwen3_5_moe runs from a config without text_config
    ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"): TransformersModel(
        published={"model_type": "qwen3_5_moe"}
    ),
    # Llama 4's text model alone (what AutoModelForCausalLM builds for a llama4 config); mlx-lm's
    # llama4_text is a dense model, its llama4 reads the MoE text model from text_config
    ("llama4_text", "Llama4ForCausalLM"): TransformersModel(
        published={"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"]},
        differs=_llama4_moe_layers_differ,
        text_alone=True,
    ),
}


def written_by(config: dict) -> TransformersModel | None:
    """How transformers wrote `config`, if it is one of TRANSFORMERS_MODELS as transformers
    writes it."""
    architectures = config.get("architectures")
    if isinstance(architectures, str):  # mlx-lm's loader takes one name too
        architectures = [architectures]
    model_type = config.get("model_type")
    if architectures is None:  # left out: transformers' own spelling of the fields says
        return next(
            (
                model
                for (kind, _), model in TRANSFORMERS_MODELS.items()
                if kind == model_type and _spelled_by_transformers(model, config)
            ),
            None,
        )
    if not isinstance(architectures, list):
        return None
    return next(
        (
            TRANSFORMERS_MODELS[(model_type, a)]
            for a in architectures
            if isinstance(a, str) and (model_type, a) in TRANSFORMERS_MODELS
        ),
        None,
    )


def _spelled_by_transformers(model: TransformersModel, config: dict) -> bool:
    """Every top-level field `model` renames is in `config` in transformers' spelling, and some
    only in it (as written, mlx-lm's model could not read them)."""
    top = {name: theirs for name, theirs in model.renamed.items() if "." not in theirs}
    return all(t in config for t in top.values()) and any(n not in config for n in top)


def as_published(config: dict) -> dict:
    """`config` as the published config.json of its model spells it (itself if transformers did
    not write it otherwise, or if mlx-lm computes it otherwise: then it is refused as written,
    whichever is first, this or the check). Its transformers spelling stays beside, as written."""
    model = written_by(config)
    if model is None or model.differs(config) is not None:
        return config
    if model.text_alone:
        return {**model.published, "text_config": config}
    config = {**config, **model.published}
    for name, theirs in model.renamed.items():
        section, _, field = theirs.rpartition(".")  # "rope_parameters.rope_theta": nested
        values = config.get(section) if section else config
        if isinstance(values, dict) and field in values:
            config[name] = values[field]
    for name, value in model.fixed.items():
        config[name] = value(config)
    return config


# transformers' model types for models mlx-lm runs under another, which it computes otherwise:
# model_type -> why (so they are not read as mlx-lm's)
COMPUTED_OTHERWISE: dict[str, str] = {
    # Hunyuan-A13B (its published config: model_type hunyuan, custom code). Its RoPE (NTK alpha),
    # q/k norms after RoPE and shared expert are mlx-lm's hunyuan's (docs/support.md: the logits
    # agree within 2e-5 once mlx-lm's top-k weights are renormalized); its routing weights are not.
    "hunyuan_v1_moe": "it is Hunyuan-A13B, which mlx-lm runs as model_type 'hunyuan', but "
    "mlx-lm's hunyuan weights each token's top-k experts by their softmax probabilities over all "
    "experts and transformers' hunyuan_v1_moe by those renormalized to sum to 1.",
}


def _phimoe_differs(config: dict) -> str | None:
    top_k = config.get("num_experts_per_tok", 2)  # mlx-lm's default, Phi-3.5-MoE's value
    if top_k == 2:
        return None
    return (
        f"its num_experts_per_tok is {top_k!r}: transformers' phimoe sparsemixer (as Phi-3.5-MoE's "
        "own code) routes every token to 2 experts whatever it says, mlx-lm's to that many; set "
        "num_experts_per_tok to 2 in config.json, what the model computes."
    )


def _dbrx_differs(config: dict) -> str | None:
    ffn = config.get("ffn_config")
    norm = ffn.get("moe_normalize_expert_weights", 1.0) if isinstance(ffn, dict) else 1.0
    if norm == 1:  # transformers' default, the published DBRX value
        return None
    return (
        f"its ffn_config.moe_normalize_expert_weights is {norm!r}: transformers' dbrx divides "
        "each token's top-k weights by their norm of that order (not at all where null), "
        "mlx-lm's by their sum (order 1, the published value) whatever it says."
    )


def _qwen2_moe_differs(config: dict) -> str | None:
    if not config.get("norm_topk_prob"):  # transformers' default, the published models' value
        return None
    return (
        "its norm_topk_prob is true: transformers' qwen2_moe renormalizes each token's top-k "
        "weights to sum to 1, mlx-lm's never does (it reads no norm_topk_prob)."
    )


def _exaone_moe_differs(config: dict) -> str | None:
    """transformers' exaone_moe reads its MoE layers from mlp_layer_types, else the layers from
    first_k_dense_replace on (1 where left out); mlx-lm's from is_moe_layer alone."""
    moe, kinds = config.get("is_moe_layer"), config.get("mlp_layer_types")
    dense, layers = config.get("first_k_dense_replace", 1), config.get("num_hidden_layers")
    if not isinstance(moe, list) or (not isinstance(kinds, list) and type(dense) is not int):
        return None  # mlx-lm reads mlp_layer_types (spellings.py), or check_config names it
    said = f"mlp_layer_types {kinds}"
    if not isinstance(kinds, list):
        said = f"first_k_dense_replace {dense}" + (
            "" if "first_k_dense_replace" in config else " (left out)"
        )
        kinds = [
            "dense" if i < dense else "sparse"
            for i in range(layers if type(layers) is int else len(moe))
        ]
    if [kind == "sparse" for kind in kinds] == [bool(m) for m in moe]:
        return None
    return (
        f"its is_moe_layer {moe} (mlx-lm's MoE layers) are not those of its {said}, which "
        "transformers' exaone_moe reads instead; make them agree as the published config.json does."
    )


# model_type -> why mlx-lm's model computes a config otherwise than transformers' (None: the same)
CONFIGS_COMPUTED_OTHERWISE: dict[str, Callable[[dict], str | None]] = {
    "phimoe": _phimoe_differs,
    "dbrx": _dbrx_differs,
    "qwen2_moe": _qwen2_moe_differs,
    "exaone_moe": _exaone_moe_differs,
    "llama4": lambda c: _llama4_moe_layers_differ(_text_config(c)),
}


def _text_config(config: dict) -> dict:
    text = config.get("text_config")
    return text if isinstance(text, dict) else {}


def computed_otherwise(config: dict) -> str | None:
    """Why mlx-lm's model computes otherwise than transformers' for `config` as transformers
    wrote it (None: the same, or not written by transformers otherwise than published)."""
    if config.get("model_type") in COMPUTED_OTHERWISE:
        return COMPUTED_OTHERWISE[config["model_type"]]
    if config.get("model_type") in CONFIGS_COMPUTED_OTHERWISE:
        return CONFIGS_COMPUTED_OTHERWISE[config["model_type"]](config)
    model = written_by(config)
    return None if model is None else model.differs(config)
