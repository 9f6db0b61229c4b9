"""The mlx-lm model file streamer picks for a config is the one mlx-lm's loader picks: the
remapping tables read from mlx_lm/utils.py's source are mlx_lm.utils' own, and the classes for
every model type mlx-lm has a file for (and every remapped name) are `_get_classes`'."""

from __future__ import annotations

import pkgutil

import mlx_lm.models
import pytest
from mlx_lm import utils

from fixtures import TINY_CONFIGS, tiny_config
from fixtures.hadamard_pack import hadamard_pack_config
from streamer.errors import StreamerError
from streamer.families import model_types
from streamer.families.model_types import mlx_lm_classes, remapping_tables


def configs() -> list[dict]:
    """Every tiny config, every model file's name and remapped name as a model_type, and every
    (model_type, architecture) pair the loader remaps, the architecture as a list and as a
    string."""
    files = [m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__)]
    found = [tiny_config(t) for t in TINY_CONFIGS] + [hadamard_pack_config()]
    found += [{"model_type": t} for t in [*files, *utils.MODEL_REMAPPING]]
    for model_type, architecture in utils.MODEL_ARCHITECTURE_REMAPPING:
        found += [
            {"model_type": model_type, "architectures": [architecture]},
            {"model_type": model_type, "architectures": architecture},
            {"model_type": model_type, "architectures": ["SomethingElse", architecture]},
        ]
    return found


def loader_classes(config: dict) -> tuple[type, type] | None:
    try:
        return utils._get_classes(config)
    # mlx-lm has no model there: ValueError, AttributeError for a helper file, SystemExit for a
    # model whose package is not installed (olmo)
    except (Exception, SystemExit):
        return None


def streamer_classes(config: dict) -> tuple[type, type] | None:
    try:
        return mlx_lm_classes(config)
    except StreamerError as e:
        assert "is not supported for expert streaming" in str(e)
        return None


def test_the_tables_read_from_the_source_are_mlx_lm_utils_own():
    assert remapping_tables() == (utils.MODEL_REMAPPING, utils.MODEL_ARCHITECTURE_REMAPPING)


def test_the_classes_are_the_ones_mlx_lm_loads():
    checked = configs()
    picked = [(config, loader_classes(config)) for config in checked]
    assert sum(classes is not None for _, classes in picked) > 100  # the walk finds the files
    assert [streamer_classes(c) for c, _ in picked] == [classes for _, classes in picked]


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"model_type": "no_such_model"},
        {"model_type": "switch_layers"},  # a helper file: no Model in it
        {"model_type": 5},
        {"model_type": ["qwen3_moe"]},
        {"model_type": "qwen3_moe", "architectures": [["Qwen3MoeForCausalLM"]]},
        {"model_type": "qwen3_moe", "architectures": 5},
    ],
)
def test_what_mlx_lm_cannot_load_is_refused_in_one_line(config):
    assert loader_classes(config) is None
    with pytest.raises(StreamerError, match="is not supported for expert streaming"):
        mlx_lm_classes(config, "config.json")


def test_tables_written_otherwise_by_a_later_mlx_lm_come_from_mlx_lm_utils(tmp_path, monkeypatch):
    (tmp_path / "utils.py").write_text("MODEL_REMAPPING = dict(mistral='llama')\n")
    monkeypatch.setattr(model_types, "package_folder", lambda: tmp_path)
    remapping_tables.cache_clear()
    try:
        assert remapping_tables() == (utils.MODEL_REMAPPING, utils.MODEL_ARCHITECTURE_REMAPPING)
    finally:
        remapping_tables.cache_clear()
