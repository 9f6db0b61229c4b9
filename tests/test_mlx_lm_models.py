"""`streamer plan` builds mlx-lm's model without mlx-lm's package __init__ (which imports
transformers), and mlx-lm behaves afterwards, in the same process, as if imported first
(streamer/families/mlx_lm_models.py). Each check runs in a fresh process: the tests' own has
mlx-lm."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_hub import cache_repo

import streamer

HEAVY = ("mlx_lm.utils", "transformers", "torch")
PLANS_THEN_LOAD = """
import json, sys
from streamer.cli import main

def heavy():
    return sorted(m for m in {heavy} if m in sys.modules)

imported = {{}}
for source in sys.argv[1:-1]:
    assert main(["plan", source, "--json", "--memory", "16G"]) == 0
    imported[source] = heavy()
from mlx_lm.generate import generate_step  # a submodule first: mlx-lm's __init__ runs before it
from mlx_lm import convert, generate
import mlx_lm, mlx_lm.models.switch_layers, mlx_lm.utils
import streamer
from streamer.families import architectures
model, tokenizer = streamer.load(sys.argv[-1])
print(json.dumps({{
    "imported": imported,
    "generate": type(generate).__name__,
    "convert": type(convert).__name__,
    "load": mlx_lm.load is mlx_lm.utils.load,
    "same classes": architectures.SwitchGLU is mlx_lm.models.switch_layers.SwitchGLU,
    "loader picks them": mlx_lm.utils._get_classes({{"model_type": "qwen3_moe"}})[0] is type(model),
    "text": streamer.generate(model, tokenizer, "hello", max_tokens=8),
}}))
"""


def run_python(code: str, *args: str, env: dict | None = None) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def after_plans(checkpoints, tmp_path_factory) -> dict:
    """A process that plans a config.json, a download and a cached name, an MLX-quantized
    download and its cached name, then loads a model."""
    download, mlx = checkpoints.hf("qwen3_moe"), checkpoints.mlx("qwen3_moe")
    cache = tmp_path_factory.mktemp("hub")
    cache_repo(cache, "tiny-org/Tiny-MoE", download)
    cache_repo(cache, "tiny-org/Tiny-MLX", mlx)
    sources = [str(download / "config.json"), str(download), "tiny-org/Tiny-MoE"]
    sources += [str(mlx), "tiny-org/Tiny-MLX"]
    repacked = str(checkpoints.repacked(download))
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    return run_python(PLANS_THEN_LOAD.format(heavy=HEAVY), *sources, repacked, env=env)


def test_plans_import_neither_mlx_lm_utils_nor_transformers(after_plans):
    assert len(after_plans["imported"]) == 5
    assert after_plans["imported"] == {source: [] for source in after_plans["imported"]}


def test_after_a_plan_mlx_lm_is_as_if_imported_first(after_plans):
    """Its __init__'s names (not the submodules of the same name), its classes the ones streamer
    builds with, and its loader picking the class of the model streamer loaded."""
    assert (after_plans["generate"], after_plans["convert"]) == ("function", "function")
    assert after_plans["load"] and after_plans["same classes"] and after_plans["loader picks them"]


def test_after_a_plan_load_generates_as_without_one(after_plans, checkpoints):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    assert after_plans["text"] == streamer.generate(model, tokenizer, "hello", max_tokens=8)


KEPT_REFERENCE = """
import json, sys
from streamer.families.mlx_lm_models import model_file, models_without_package_init

qwen3_moe = model_file("qwen3_moe")
with models_without_package_init():
    import mlx_lm as kept  # the package with its __init__ not run yet
before = "mlx_lm" in sys.modules, hasattr(kept, "stream_generate")
try:
    kept.no_such_name
except AttributeError:
    missing = True
import mlx_lm
print(json.dumps({
    "before": before,
    "missing": missing,
    "same module": mlx_lm is kept and sys.modules["mlx_lm"] is kept,
    "version": kept.__version__,
    "same classes": mlx_lm.utils._get_classes({"model_type": "qwen3_moe"})[0] is qwen3_moe.Model,
}))
"""


def test_a_kept_reference_to_the_unfinished_package_finishes_it_on_a_missing_name():
    """Code that imported mlx_lm inside the block holds the package before its __init__ ran: the
    first name it lacks runs the __init__ in it (once), and it is sys.modules["mlx_lm"] again."""
    from mlx_lm import __version__

    found = run_python(KEPT_REFERENCE)
    # hasattr's read finished it: the next name missing is missing from mlx-lm's __init__ too
    assert found["before"] == [False, True] and found["missing"]
    assert found["same module"] and found["same classes"] and found["version"] == __version__
