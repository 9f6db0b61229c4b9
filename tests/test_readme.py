"""The README's "Where things are" names every module of streamer/ under its own folder, so the
map a newcomer reads is the tree (a new module fails here until it is placed)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "streamer"


def groups() -> dict[str, str]:
    """Label (the first column, e.g. "streamer/io/") -> its text, from the section's code block."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Where things are") :]
    block = section[section.index("```\n") + 4 :]
    block = block[: block.index("```")]
    found: dict[str, str] = {}
    label = None
    for line in block.splitlines():
        if line[:1].strip():
            label, _, line = line.partition(" ")
            found[label] = ""
        found[label] += " " + line.strip()
    return found


def label_of(path: Path) -> str:
    """The group a module belongs in: its first folder under streamer/, or streamer/ itself."""
    parts = path.relative_to(ROOT).parts
    return "/".join(parts[:2]) + "/" if len(parts) > 2 else "streamer/"


def test_every_module_is_named_under_its_folder():
    listed = groups()
    missing = sorted(
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if not (path.name == "__init__.py" and path.parent != PACKAGE)  # the folder's own label
        and not re.search(rf"(^|[\s(/]){re.escape(path.name)}\b", listed.get(label_of(path), ""))
    )
    assert not missing, f"name these in README.md's 'Where things are': {missing}"


def test_every_folder_has_its_group():
    folders = {f"streamer/{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders - set(groups()) == set()
    assert "streamer/io/" in groups() and "mapping.py" in groups()["streamer/io/"]
