"""mlx-lm's model built for a config, its expert containers found by type, quantized as mlx-lm
loads it, its routing recorded.

Architectures themselves come from mlx-lm (`mlx_lm.models.<model_type>`); which model types
stream (and why the others do not) is model_types.py, how each family's checkpoints name expert
tensors hf_naming.py, transformers 5's config spellings transformers/spellings.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import StreamerError, one_line
from ..expert_traffic import ExpertStats
from ..routing_trace import Routing, RoutingRecorder
from .config import check_config
from .expert_lists import STACKED_MODELS
from .mlx_lm_models import models_without_package_init
from .model_types import mlx_lm_classes
from .rope_scaling import refuse_ignored_rope_scaling
from .saved_quantization import saved_quantization
from .transformers.spellings import normalize_config
from .unread_quantization import refuse_left_to_sanitize, refuse_unread_quantization

with models_without_package_init():
    from mlx_lm.models.switch_layers import (
        QuantizedSwitchLinear,
        SwitchGLU,
        SwitchLinear,
        SwitchMLP,
    )

EXPERT_CONTAINERS = (SwitchGLU, SwitchMLP)
EXPERT_PROJECTIONS = (SwitchLinear, QuantizedSwitchLinear)


def build_model(config: dict, where: Path | str) -> nn.Module:
    """An mlx-lm model for `config` with lazily initialised (never evaluated) weights."""
    check_config(config, where)  # the family's refusals too
    model_class, args_class = mlx_lm_classes(config, where)
    # a model whose experts are a list of MLPs: built with them stacked in a Switch layer
    model_class = STACKED_MODELS.get(model_class.__module__.rsplit(".", 1)[1], model_class)
    try:
        model = model_class(args_class.from_dict(config))
    except Exception as e:
        # what check_config cannot see (a combination of fields the model's asserts refuse):
        # mlx-lm's constructors raise no common error type
        raise StreamerError(
            f"{where}: the config does not describe a {config['model_type']} model mlx-lm can "
            f"build ({type(e).__name__}: {e}); compare it with the model's published config.json."
        ) from e
    if not any(isinstance(m, EXPERT_CONTAINERS) for _, m in model.named_modules()):
        refuse_dense(config, where, model_class.__module__)
    refuse_ignored_rope_scaling(model, config, where)
    return model


def refuse_dense(config: dict, where: Path | str, module: str) -> NoReturn:
    """A dense model (mlx-lm builds it with no MoE layers) is told so first: it has no experts to
    stream, and mlx-lm runs it as it is. No near model type is offered: the config's is right."""
    folder = Path(where).parent
    raise StreamerError(
        f"{where}: model_type {config.get('model_type')!r} is a dense model, not a MoE model "
        f"(mlx-lm's {module} model has no MoE layers): it has no experts to stream. mlx-lm runs "
        f"dense models as they are (`mlx_lm.generate --model {folder}`); docs/support.md lists "
        "the model types that stream."
    )


def check_streams(config: dict, where: Path | str) -> None:
    """Refuse, as a repack would, a config.json whose model cannot stream (a dense model, a
    family refused, a quantization_config repack does not read), before a message suggests
    repacking it."""
    normalized = normalize_config(check_config(config, where))
    model = build_model(normalized, where)
    refuse_unread_quantization(normalized, where)
    refuse_left_to_sanitize(model, config, where)


def expert_containers(model: nn.Module) -> dict[str, nn.Module]:
    """Module path -> expert container (SwitchGLU / SwitchMLP), in layer order."""
    found = [(path, m) for path, m in model.named_modules() if isinstance(m, EXPERT_CONTAINERS)]
    found.sort(key=lambda item: [int(t) if t.isdigit() else t for t in item[0].split(".")])
    if not found:
        raise StreamerError("the model has no MoE layers: nothing to stream.")
    return dict(found)


def container_projections(container: nn.Module) -> list[str]:
    return [
        name
        for name, child in container.children().items()
        if isinstance(child, EXPERT_PROJECTIONS)
    ]


def expert_container_of(name: str, containers: dict[str, nn.Module]) -> str | None:
    """The expert container whose projections hold tensor `name`; None for any other tensor. A
    container's other children (Muse Spark's `experts.post_expert_norm`) are resident weights.
    Looked up by the name's prefixes, not by scanning the containers: a load asks for every
    tensor (Kimi K2: 2,558 tensors, 60 containers)."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        path = ".".join(parts[:end])
        container = containers.get(path)
        if container is not None:
            return path if parts[end] in container_projections(container) else None
    return None


def projection_tensors(container: nn.Module) -> dict[str, mx.array]:
    """`proj.kind` -> stacked array of each of `container`'s expert projections."""
    return {
        f"{proj}.{name}": array
        for proj in container_projections(container)
        for name, array in tree_flatten(container[proj].parameters())
    }


def quantization_of(container: nn.Module) -> dict[str, dict | None]:
    """Projection -> the parameters `to_quantized` rebuilds it with (None: unquantized), as a
    manifest records them; `global_scale` where each expert has an NVFP4 tensor scale."""
    quantization = {}
    for proj in container_projections(container):
        m = container[proj]
        params = None
        if isinstance(m, QuantizedSwitchLinear):
            params = {"group_size": m.group_size, "bits": m.bits, "mode": m.mode}
            if m.get("global_scale") is not None:
                params["global_scale"] = True
        quantization[proj] = params
    return quantization


def replace_modules(model: nn.Module, replacements: dict[str, nn.Module]) -> None:
    model.update_modules(tree_unflatten(list(replacements.items())))


def quantize_like_mlx_lm(
    model: nn.Module,
    config: dict,
    weights: dict[str, mx.array] | None = None,
    *,
    quantizable: Callable[[str, nn.Module], bool | dict] | None = None,
) -> None:
    """Quantize `model`'s layers exactly as `mlx_lm.utils.load_model` would for these weights:
    config.json's per-module entries first, then each layer whose weights have scales, as
    saved_quantization.py decides (a per-expert global scale, NVFP4's, where they have one).
    `quantizable(path, module)` decides instead of the weights where there are none (a plan)."""
    quantization = config.get("quantization")
    if quantization is None:
        return

    def from_weights(path: str, module: nn.Module) -> bool | dict:
        return saved_quantization(path, module, weights, quantization)

    decide = quantizable or from_weights

    def predicate(path: str, module: nn.Module):
        if path in quantization:
            return quantization[path]
        return decide(path, module)

    try:
        nn.quantize(
            model,
            group_size=quantization["group_size"],
            bits=quantization["bits"],
            mode=quantization.get("mode", "affine"),
            class_predicate=predicate,
        )
    except ValueError as e:  # MLX's: a group size that does not divide a layer, an unknown mode
        settings = {k: v for k, v in quantization.items() if k in ("group_size", "bits", "mode")}
        raise StreamerError(
            f"the model config's quantization {settings} is not one MLX can quantize this "
            f"model with ({one_line(e)}): the config is damaged or belongs to another model."
        ) from None


def quantize_like_mlx_lm_convert(
    model: nn.Module, config: dict, group_size: int, bits: int, mode: str
) -> dict:
    """Quantize `model` as `mlx_lm.convert --quantize` does, and return its config with the
    quantization mlx-lm writes: each layer that can be whose width the group size divides, as
    the model's own recipe (its quant_predicate) says; each layer named where the config was
    quantized in part already (gpt-oss's MXFP4 experts). mlx_lm.utils.quantize_model's rule,
    which tests/test_record_size.py checks against it, without importing mlx_lm.utils (it imports
    transformers: seconds of `streamer plan --quantize`)."""
    asked = {"group_size": group_size, "bits": bits, "mode": mode}
    in_part = "quantization" in config
    quantization = copy.deepcopy(config["quantization"]) if in_part else dict(asked)
    recipe = getattr(model, "quant_predicate", None)

    def predicate(path: str, module: nn.Module) -> bool | dict:
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            return False
        chosen = recipe(path, module) if recipe is not None else True
        if isinstance(chosen, dict) or (in_part and chosen):
            quantization[path] = chosen if isinstance(chosen, dict) else asked
        return chosen

    try:
        nn.quantize(model, group_size, bits, mode=mode, class_predicate=predicate)
    except ValueError as e:  # a layer the model's own recipe quantizes in groups its width
        # does not divide (a router at group size 64 of a width 96): mlx_lm.convert fails alike
        raise StreamerError(
            f"--quantize {bits} --group-size {group_size} --q-mode {mode}: mlx-lm cannot "
            f"quantize this model so, and mlx_lm.convert fails alike ({one_line(e)}); choose "
            "another --group-size."
        ) from e
    # mlx-lm writes it under both names (quantization_config: transformers')
    return {
        **copy.deepcopy(config),
        "quantization": quantization,
        "quantization_config": quantization,
    }


@contextmanager
def recording_routing(model: nn.Module, prefill: bool = False) -> Iterator[list[Routing]]:
    """The routing of every MoE layer of `model` (decode steps; with `prefill`, prompt tokens too)
    while the context lasts: a streamer model's own trace, or for any other mlx-lm model, its
    expert containers wrapped in RoutingRecorders for the duration."""
    handle = getattr(model, "streamer", None)
    if handle is not None:
        stats, containers = handle.stats, None
    else:
        containers = expert_containers(model)
        stats = ExpertStats(moe_layers=len(containers))
        recorders = {
            p: RoutingRecorder(c, stats.record_routing, i)
            for i, (p, c) in enumerate(containers.items())
        }
        replace_modules(model, recorders)
    stats.trace, stats.trace_prefill = [], prefill
    try:
        yield stats.trace
    finally:
        stats.trace, stats.trace_prefill = None, False
        if containers is not None:
            replace_modules(model, containers)
