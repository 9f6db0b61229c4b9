"""Every mlx-lm model file that builds MoE experts has a tiny config here (or is refused with a
reason), so a new mlx-lm pin shows its new families at once; the private mlx-lm helpers streamer
relies on behave as it expects."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import mlx_lm.models
import pytest
from mlx_lm.models import switch_layers
from mlx_lm.utils import (
    MODEL_REMAPPING,
    _compressed_tensors_quantization,
    _get_classes,
    _takes_global_scale,
)

from fixtures import TINY_CONFIGS, tiny_config
from fixtures.hadamard_pack import hadamard_pack_config
from streamer.errors import StreamerError
from streamer.families.architectures import build_model, expert_containers
from streamer.families.model_types import REFUSED, architecture, mlx_lm_model_type

SWITCH = re.compile(r"\b(SwitchGLU|SwitchMLP|SwitchLinear)\b")
EXPERT_LIST = re.compile(r"self\.experts\s*=\s*\[")  # DBRX: a list of per-expert MLPs
IMPORT = re.compile(r"^from \.(\w+) import|^from \. import ([\w, ]+)", re.M)


def moe_model_files() -> set[str]:
    """mlx_lm.models modules whose models can hold experts: they build Switch layers or expert
    lists themselves, or import a module that does (wrappers such as gemma4 or kimi_k25)."""
    folder = Path(mlx_lm.models.__path__[0])  # read, not imported: some need optional packages
    sources = {
        m.name: (folder / f"{m.name}.py").read_text()
        for m in pkgutil.iter_modules(mlx_lm.models.__path__)
        if m.name != "switch_layers"
    }
    imports = {
        name: {n.strip() for a, b in IMPORT.findall(src) for n in (a or b).split(",")}
        for name, src in sources.items()
    }
    moe = {n for n, src in sources.items() if SWITCH.search(src) or EXPERT_LIST.search(src)}
    while True:
        more = {n for n, deps in imports.items() if deps & moe} - moe
        if not more:
            return moe
        moe |= more


def covered_model_files() -> set[str]:
    """The modules whose classes make up a model built from a tiny config, expert layers and all."""
    covered = set()
    # the families published only quantized have their configs beside their writers
    for config in [tiny_config(t) for t in TINY_CONFIGS] + [hadamard_pack_config()]:
        model = build_model(config, config["model_type"])
        assert expert_containers(model)
        covered |= {type(m).__module__.rsplit(".", 1)[1] for _, m in model.named_modules()}
        covered.add(mlx_lm_model_type(config))
    return covered


def test_every_mlx_lm_moe_model_has_a_tiny_config_or_a_reason():
    moe = moe_model_files()
    assert {"qwen3_moe", "dbrx", "gemma4", "kimi_k25"} <= moe  # the walk finds what it should
    missing = moe - covered_model_files() - set(REFUSED)
    assert not missing, (
        f"MoE model files with no tiny config in fixtures/configs: {sorted(missing)}"
    )


def test_remapped_model_types_run_on_their_files():
    """mlx-lm's own remapping (kimi_k2 -> deepseek_v3, minimax_m2 -> minimax, ...) is what
    streamer follows: a remapped model_type streams exactly when its target file does."""
    moe = moe_model_files()
    for alias, target in MODEL_REMAPPING.items():
        if target in moe:
            assert mlx_lm_model_type({"model_type": alias}) == target


@pytest.mark.parametrize("model_type", ["qwen3_moe", "kimi_k2", "minimax_m2"])
def test_private_mlx_lm_helpers_behave_as_streamer_expects(model_type):
    """`_get_classes` (mlx_lm.utils) returns the remapped model file's Model and ModelArgs;
    `SwitchGLU` holds `gate_proj`/`up_proj`/`down_proj` SwitchLinears with experts first."""
    model_class, args_class = _get_classes({"model_type": model_type})
    target = MODEL_REMAPPING.get(model_type, model_type)
    assert model_class.__module__ == f"mlx_lm.models.{target}"
    assert args_class.__module__ == f"mlx_lm.models.{target}"
    glu = switch_layers.SwitchGLU(64, 32, 4)
    assert [type(glu[p]) for p in ("gate_proj", "up_proj", "down_proj")] == [
        switch_layers.SwitchLinear
    ] * 3
    assert glu.gate_proj.weight.shape == (4, 32, 64) and glu.gate_proj.num_experts == 4
    quantized = glu.gate_proj.to_quantized(group_size=32, bits=4)
    assert isinstance(quantized, switch_layers.QuantizedSwitchLinear)
    assert (quantized.num_experts, quantized.group_size, quantized.bits) == (4, 32, 4)
    # `_takes_global_scale` (mlx_lm.utils): which layers hold NVFP4's per-expert tensor scale
    assert _takes_global_scale(glu.gate_proj)
    nvfp4 = glu.gate_proj.to_quantized(group_size=16, bits=4, mode="nvfp4", global_scale=True)
    assert nvfp4.global_scale.shape == (4,)


def test_mlx_lm_reads_compressed_tensors_packs_as_streamer_expects():
    """`_compressed_tensors_quantization` (mlx_lm.utils), which normalize_config asks: the packs'
    MLX quantization, and a ValueError for a format mlx-lm does not read."""
    read = _compressed_tensors_quantization
    assert read({"format": "mxfp4-pack-quantized"}) == {
        "group_size": 32,
        "bits": 4,
        "mode": "mxfp4",
    }
    assert read({"format": "pack-quantized"}) == {"group_size": 32, "bits": 4, "mode": "affine"}
    with pytest.raises(ValueError):
        read({"format": "float-quantized"})


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_a_refused_family_is_refused_with_its_reason(model_type):
    with pytest.raises(StreamerError) as refused:
        architecture({"model_type": model_type}, "config.json")
    assert str(refused.value) == (
        f"config.json: model_type {model_type!r} is not supported for expert streaming: "
        f"{REFUSED[model_type]} docs/support.md lists the model types that stream."
    )
