"""Imports flow one way: cli/API -> model assembly -> layer (experts/) -> cache/ -> io/. Read from
the sources (every import statement, function-level ones too), so a new arrow back up the house
fails here rather than in a review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "streamer"
LEAVES = {"streamer.errors"}  # imported from anywhere: the one error type
# What each lower folder may import from streamer besides itself and LEAVES.
BELOW = {
    "streamer.io": set(),
    "streamer.cache": {"streamer.io"},
    "streamer.experts": {"streamer.cache", "streamer.io", "streamer.stats"},
}
# Model assembly and the Python API: never the commands or the server above them.
ASSEMBLY = (
    "model",
    "inplace",
    "assembly",
    "handle",
    "generate",
    "architectures",
    "config",
    "tokenizer",
    "backend",
    "download",
    "download_layers",
)
ABOVE_ASSEMBLY = ("streamer.cli", "streamer.server", "streamer.chat")


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


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_the_walk_sees_the_imports():
    """The parser resolves what the checks below rely on (a broken walk would pass them all)."""
    assert "streamer.io.manifest" in imported(PACKAGE / "cache" / "budget.py")
    assert "streamer.cli" in imported(PACKAGE / "__main__.py")
    assert "streamer.experts.layer" in imported(PACKAGE / "experts" / "__init__.py")


@pytest.mark.parametrize("folder", sorted(BELOW))
def test_lower_folders_import_only_below_themselves(folder):
    allowed = {folder, *BELOW[folder], *LEAVES}
    wrong = {
        f"{module_name(path)} imports {name}"
        for path in SOURCES
        if within(module_name(path), [folder])
        for name in imported(path)
        if not within(name, allowed)
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


def test_model_assembly_does_not_import_the_commands_or_the_server():
    wrong = {
        f"{module_name(path)} imports {name}"
        for path in SOURCES
        if within(module_name(path), [f"streamer.{m}" for m in ASSEMBLY])
        for name in imported(path)
        if within(name, ABOVE_ASSEMBLY)
    }
    assert not wrong, sorted(wrong)
