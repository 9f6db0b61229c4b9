"""Which model types stream: the mlx-lm model file a config runs on (as mlx-lm's loader picks
it), the families refused and why, and each family's HF expert naming.

mlx-lm's loader (`mlx_lm.utils._get_classes`) remaps some model types onto other files through two
tables in mlx_lm/utils.py; they are read from its source, since importing mlx_lm.utils imports
transformers (seconds, for `streamer plan`). tests/test_model_types.py checks that they are
mlx_lm.utils' own and that the classes picked here are `_get_classes`'.
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
from pathlib import Path
from typing import NoReturn

from ..errors import StreamerError
from .hf_naming import NAMING, Architecture
from .mlx_lm_models import model_file, package_folder, package_version
from .transformers.renamed_models import as_published, computed_otherwise

REMAPPING_TABLES = ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING")
MOE_SOURCE = re.compile(r"\b(SwitchGLU|SwitchMLP|SwitchLinear)\b|self\.experts\s*=\s*\[")
CLOSE = 0.8  # difflib ratio: a misspelling (qwen3_mo for qwen3_moe: 0.94), not a shared half

# mlx-lm model files that build experts streamer does not stream (yet), and why.
REFUSED: dict[str, str] = {
    "kimi_vl": "mlx-lm's kimi_vl sanitize does not split MLA's kv_b_proj, so mlx-lm cannot load "
    "the published checkpoint either (its MLX conversions come from mlx-vlm).",
}


def architecture(config: dict, where: Path | str) -> Architecture:
    """The HF expert naming of `config`'s family (after mlx-lm's own model-type remapping)."""
    otherwise = computed_otherwise(config)  # config.json as transformers wrote it
    if otherwise is not None:
        refuse(config, where, f"mlx-lm computes it otherwise than transformers: {otherwise}")
    model_type = mlx_lm_model_type(config, where)
    if model_type in REFUSED:
        refuse(config, where, REFUSED[model_type])
    return NAMING.get(model_type, Architecture())


def mlx_lm_model_type(config: dict, where: Path | str = "config.json") -> str:
    """The mlx-lm model file `config` runs on (`mlx_lm.models.<this>`), as mlx-lm's loader picks."""
    # the file mlx-lm imports (its Model may come from another: solar_open runs glm4_moe's)
    return mlx_lm_classes(config, where)[1].__module__.rsplit(".", 1)[1]


def mlx_lm_classes(config: dict, where: Path | str = "config.json") -> tuple[type, type]:
    """mlx-lm's Model and ModelArgs classes for `config`, as `mlx_lm.utils._get_classes` picks
    them; a config mlx-lm has no model file for is refused."""
    model_remapping, architecture_remapping = remapping_tables()
    config = as_published(config)  # a model transformers names otherwise: as mlx-lm knows it
    model_type = config.get("model_type")
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    try:
        remapped = (architecture_remapping.get((model_type, a)) for a in architectures)
        name = next((r for r in remapped if r is not None), None)
        if name is None:
            name = model_remapping.get(model_type, model_type)
        if not isinstance(name, str):
            raise TypeError(name)
        module = model_file(name)
        return module.Model, module.ModelArgs
    # no such file, not a model's, or one that needs a package not installed (olmo exits)
    except (ImportError, ValueError, TypeError, AttributeError, SystemExit):
        refuse(config, where, f"it is not a model that mlx-lm {package_version()} runs.", True)


@functools.cache
def remapping_tables() -> tuple[dict, dict]:
    """mlx_lm.utils' MODEL_REMAPPING and MODEL_ARCHITECTURE_REMAPPING, from its source; imported
    (slowly) if a later mlx-lm writes them otherwise."""
    tree = ast.parse((package_folder() / "utils.py").read_text())
    found = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1
        if isinstance(node.targets[0], ast.Name) and node.targets[0].id in REMAPPING_TABLES
    }
    try:
        return tuple(ast.literal_eval(found[name]) for name in REMAPPING_TABLES)
    except (KeyError, ValueError):
        from mlx_lm import utils

        return tuple(getattr(utils, name) for name in REMAPPING_TABLES)


def refuse(config: dict, where: Path | str, reason: str, nearest: bool = False) -> NoReturn:
    """`nearest`: name the model type that streams whose name is close, where the config's may
    be a misspelling (qwen3_mo for qwen3_moe)."""
    model_type = config.get("model_type")
    closest = closest_streaming(model_type) if nearest else None
    hint = f" The closest model type that streams is {closest!r};" if closest else ""
    raise StreamerError(
        f"{where}: model_type {model_type!r} is not supported for expert streaming: {reason}"
        f"{hint} docs/support.md lists the model types that stream."
    )


def closest_streaming(model_type: object) -> str | None:
    """The streaming model type whose name is nearest `model_type`, if one is near (difflib's
    ratio at least CLOSE: a letter or two apart, as a misspelling is):
    mlx-lm's model files that build experts (as tests/test_coverage.py finds them: each streams
    or is REFUSED) and the names mlx-lm remaps onto them."""
    if not isinstance(model_type, str):
        return None
    files = {
        path.stem
        for path in (package_folder() / "models").glob("*.py")
        if path.stem != "switch_layers" and MOE_SOURCE.search(path.read_text())
    } - set(REFUSED)
    names = files | {k for k, v in remapping_tables()[0].items() if v in files}
    close = difflib.get_close_matches(model_type, sorted(names), n=1, cutoff=CLOSE)
    return close[0] if close else None
