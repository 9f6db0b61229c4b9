"""Imports flow one way: cli/ -> the front ends and the API -> model assembly -> layer (experts/)
-> cache/ -> io/, every module of streamer/ placed in one layer. Read from the sources (every
import statement, function-level ones too), so a new arrow back up the house fails here rather
than in a review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "streamer"
# Every module and package of streamer/, top to bottom: each imports only from its own layer and
# the layers below it. A new module fails test_every_module_has_a_layer until placed.
LAYERS = {
    "entry": {"streamer.__main__", "streamer.cli"},
    "front ends": {"streamer.server"},
    "API and tools": {
        "streamer",  # the package: load, generate
        "streamer.generate",
        "streamer.api_request",
        "streamer.kv_quantization",
        "streamer.input_embeddings",
        "streamer.response",
        "streamer.mlx_lm_keywords",
        "streamer.generation_objects",
        "streamer.run_stats",
        "streamer.speculative",
        "streamer.verify",
        "streamer.pull",
        "streamer.pulled_files",
        "streamer.plan",
        "streamer.repack",
        "streamer.parallel.split",
    },
    "model assembly": {
        "streamer.loading",
        "streamer.families",
        "streamer.parallel",
        "streamer.arguments",
        "streamer.defaults",
        "streamer.progress",
    },
    "layer": {
        "streamer.experts",
        "streamer.expert_traffic",
        "streamer.draft_accounting",
        "streamer.routing_trace",
        "streamer.cpu_cores",
    },
    "cache": {"streamer.cache"},
    "io": {"streamer.io"},
    "the one error type": {"streamer.errors"},
}
ORDER = list(LAYERS)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every streamer module `path` imports, relative imports resolved."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            names.add(target)
            # `from . import x` and `from .pkg import module` name modules too
            names |= {f"{target}.{alias.name}" for alias in node.names}
    return {n for n in names if n == "streamer" or n.startswith("streamer.")}


def within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def unit(name: str) -> str:
    """The layer table's entry that holds module `name`: the longest entry it is or lies under
    (a package such as streamer.parallel may place one module in another layer), or the package
    itself for a name imported from it (`from streamer import load`)."""
    held = [u for u in PLACED if name == u or name.startswith(u + ".")]
    return max(held, key=len) if held else "streamer"


def layer_of(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS.values()) if unit(name) in layer)


SOURCES = sorted(PACKAGE.rglob("*.py"))
UNITS = {".".join(module_name(p).split(".")[:2]) for p in SOURCES}
PLACED = set().union(*LAYERS.values())


def test_the_walk_sees_the_imports():
    """The parser resolves what the checks below rely on (a broken walk would pass them all)."""
    assert "streamer.io.manifest" in imported(PACKAGE / "cache" / "budget.py")
    assert "streamer.cli" in imported(PACKAGE / "__main__.py")
    assert "streamer.experts.layer" in imported(PACKAGE / "experts" / "__init__.py")
    assert unit("streamer.io.mapping") == "streamer.io" and unit("streamer.load") == "streamer"
    assert unit("streamer.parallel.split") == "streamer.parallel.split"
    assert unit("streamer.parallel.group") == "streamer.parallel"


def test_every_module_has_a_layer():
    modules = {module_name(p) for p in SOURCES}
    assert UNITS - PLACED == set(), "place each in LAYERS"
    assert PLACED - modules == set(), "LAYERS names modules that are gone"


@pytest.mark.parametrize("layer", ORDER)
def test_imports_flow_down_the_layers(layer):
    rank = ORDER.index(layer)
    wrong = {
        f"{module_name(path)} ({layer}) imports {name} ({ORDER[layer_of(name)]})"
        for path in SOURCES
        if unit(module_name(path)) in LAYERS[layer]
        for name in imported(path)
        if layer_of(name) < rank
    }
    assert not wrong, sorted(wrong)


def test_only_the_entry_point_imports_the_cli():
    wrong = {
        f"{module_name(path)} imports {name}"
        for path in SOURCES
        if not within(module_name(path), ["streamer.cli", "streamer.__main__"])
        for name in imported(path)
        if within(name, ["streamer.cli"])
    }
    assert not wrong, sorted(wrong)


def test_no_package_imports_another_that_imports_it_back():
    """No cycle between the units of LAYERS (a package and one it imports importing it back,
    directly or through others), so each can be read, and tested, below the ones that use it."""
    arrows = {u: set() for u in PLACED}
    for path in SOURCES:
        here = unit(module_name(path))
        arrows[here] |= {unit(n) for n in imported(path) if unit(n) != here} - {"streamer"}
    done: set[str] = set()

    def walk(u: str, trail: list[str]) -> None:
        assert u not in trail, " -> ".join([*trail[trail.index(u) :], u])
        if u not in done:
            for v in sorted(arrows[u]):
                walk(v, [*trail, u])
            done.add(u)

    for u in sorted(arrows):
        walk(u, [])


def test_every_module_fits_on_a_few_screens():
    """A module is one idea: past 260 lines it is two, and is split (docs/layout.md maps them)."""
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in SOURCES
        if (n := len(p.read_text().splitlines())) > 260
    }
    assert not long, long
