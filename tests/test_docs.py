"""The documents hold: docs/layout.md ("Every module") names every module of streamer/ under
its own folder, so the map a newcomer reads is the tree (a new module fails here until it is
placed), and every file the README and docs/ link to exists."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "streamer"


def groups() -> dict[str, str]:
    """Label (the first column, e.g. "streamer/io/") -> its text, from the section's code block."""
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    section = layout[layout.index("\n## Every module\n") :]
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
    assert not missing, f"name these in docs/layout.md: {missing}"


def test_every_folder_has_its_group():
    folders = {f"streamer/{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders - set(groups()) == set()
    assert "streamer/io/" in groups() and "mapping.py" in groups()["streamer/io/"]


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCH_DOCUMENTS = [ROOT / "bench" / "README.md", ROOT / "bench" / "findings.md"]


def anchors(document: Path) -> set[str]:
    """The anchors of a Markdown document's headings, as GitHub makes them."""
    text = document.read_text(encoding="utf-8")
    titles = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


def broken(document: Path, target: str) -> bool:
    """Whether a link of `document` to `target` (path, path#anchor or #anchor) leads nowhere."""
    path, _, anchor = target.partition("#")
    linked = document.parent / path if path else document
    if not linked.exists():
        return True
    return bool(anchor) and linked.suffix == ".md" and anchor not in anchors(linked)


@pytest.mark.parametrize("document", DOCUMENTS + BENCH_DOCUMENTS, ids=lambda p: p.name)
def test_every_linked_file_exists(document):
    """Markdown links to files of the repository ([text](path) or path#anchor) resolve, from the
    document's own folder, and an anchor into a Markdown file is one of its headings; links to
    the web are not followed."""
    targets = re.findall(r"\]\(([^)\s]+)\)", document.read_text(encoding="utf-8"))
    missing = sorted({t for t in targets if not re.match(r"[a-z]+:", t) and broken(document, t)})
    assert not missing, f"{document.name} links to files or headings that do not exist: {missing}"


def test_the_readme_links_every_document():
    """Each document of docs/ is reachable from the README's first screen."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_screen = "\n".join(readme.splitlines()[:150])
    unlinked = [p.name for p in DOCUMENTS[1:] if f"(docs/{p.name})" not in first_screen]
    assert not unlinked, f"link these from the README's first 150 lines: {unlinked}"


# A file a docstring or comment names: a module, a path from the package or the repository root,
# a document (a `*` is a glob: tests/test_server_*.py). Placeholders (<model_type>) are not names.
FILE_NAME = re.compile(r"(?<![\w./*<>-])((?:[\w*-]+/)*[\w*-]+\.(?:py|md|sh))\b(?![\w/-])")
# Files of other projects named where the code follows them: mlx-lm's, MLX's, transformers' own
# sources (resolved in the installed package), and the remote code a Hugging Face download ships.
INSTALLED = ("mlx_lm", "mlx", "transformers")
NOTES = "shared/notes/"  # the team's measured facts, kept beside the repository, not in it
DOWNLOAD_CODE = re.compile(r"(modeling|configuration|tokenization)_\w+\.py")
SOURCES = sorted(
    path for d in ("streamer", "tools", "bench", "tests") for path in (ROOT / d).rglob("*.py")
)


def docstrings_and_comments(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every module, class and function docstring."""
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return [(n, line.partition("#")[2]) for n, line in enumerate(source.splitlines(), 1)]
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text is not None:
                found.append((node.body[0].lineno, text))
    return found


def resolves(name: str, source: Path) -> bool:
    """`name` is a file of this repository, from the naming file's folder, the repository root or
    the streamer package; or a file of an installed project the code follows, or of a download."""
    if name.startswith(NOTES) or DOWNLOAD_CODE.fullmatch(name):
        return True
    bases = [source.parent, ROOT, PACKAGE]
    top = name.split("/")[0]
    if top in INSTALLED and "/" in name and (spec := importlib.util.find_spec(top)):
        bases += [Path(p).parent for p in spec.submodule_search_locations or []]
    return any(any(base.glob(name)) for base in bases)


def test_every_file_a_docstring_or_comment_names_exists():
    stale = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in [*SOURCES, ROOT / "pyproject.toml"]
        for line, text in docstrings_and_comments(path)
        for name in FILE_NAME.findall(text)
        if not resolves(name, path)
    ]
    assert not stale, "these name files that do not exist:\n" + "\n".join(stale)


def test_the_bench_index_names_every_script():
    """bench/README.md's front door lists every script of bench/ in its index ("The scripts")."""
    readme = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    index = readme[readme.index("\n## The scripts\n") :]
    index = index[: index.index("\n## ", 1)]
    scripts = [p.name for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh")]
    missing = sorted(name for name in scripts if f"`{name}`" not in index)
    assert not missing, f"name these in bench/README.md's index of scripts: {missing}"


# A section of the bench's documents named by its title: bench/findings.md, "Real shapes" (the
# title may run over lines of a comment or docstring).
SECTION = re.compile(r"bench/(README|findings)\.md,? \(?\"([^\"]+)\"")


def test_every_bench_section_named_is_a_heading():
    """A bench section the code or the docs name by its title begins a heading of that document."""
    headings = {
        name: [
            line.lstrip("#").strip()
            for line in (ROOT / "bench" / f"{name}.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("#")
        ]
        for name in ("README", "findings")
    }
    texts = [*SOURCES, *sorted((ROOT / "fixtures").rglob("*.py")), *DOCUMENTS]
    named = [
        (path, name, re.sub(r"\s*\n\s*(#\s*)?", " ", quoted))  # one line, comment marks gone
        for path in texts
        for name, quoted in SECTION.findall(path.read_text(encoding="utf-8"))
    ]
    missing = sorted(
        f"{path.relative_to(ROOT)}: bench/{name}.md, {title!r}"
        for path, name, title in named
        if not any(heading.startswith(title) for heading in headings[name])
    )
    assert not missing, "these name bench sections no heading begins with:\n" + "\n".join(missing)


# A group of flags the synopsis names in brackets -> how its comment line begins
SYNOPSIS_GROUPS = {"sampling flags": "sampling", "KV flags": "KV", "drafts": "drafts"}


def synopsis_flags() -> dict[str, set[str]]:
    """Command -> the `--flags` docs/commands.md's synopsis block gives it, with its named groups
    (`[sampling flags]`, `[KV flags]`, `[drafts]`) replaced by the flags their comment lines list;
    a command's lines run on to the next `streamer` or comment line."""
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    block = text[text.index("```sh\n") + 6 :]
    block = block[: block.index("```")]
    joined = re.sub(r"\n#\s{2,}", " ", block)  # a comment continued on its next line, joined
    groups = {
        name: set(re.findall(r"--[\w-]+", joined.split(f"\n# {label}")[1].split("\n")[0]))
        for name, label in SYNOPSIS_GROUPS.items()
    }
    found: dict[str, set[str]] = {}
    command = None
    for line in block.splitlines():
        if line.startswith("#"):
            command = None
            continue
        words = line.split("#")[0]
        if line.startswith("streamer "):
            command = words.split()[1]
        if command is None:
            continue
        flags = set(re.findall(r"(?<![\w-])--?\w[\w-]*", words))  # -p too
        flags |= {f for name, group in groups.items() if f"[{name}]" in words for f in group}
        found.setdefault(command, set()).update(flags)
    return found


def test_the_synopsis_gives_every_command_its_flags():
    """Each command's flags in docs/commands.md's synopsis are its parser's, no more, no less."""
    import argparse

    from streamer.cli import parser

    top = parser()
    commands = top._subparsers._group_actions[0].choices
    documented = synopsis_flags()
    assert documented.pop("--version") == {"--version"}
    assert set(documented) == set(commands), "commands missing from, or stale in, the synopsis"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| [docs/commands.md]"))
    assert set(re.findall(r"\w+", row.split("every command and flag:")[1])) == set(commands)
    wrong = {}
    for name, command in commands.items():
        flags = {
            option
            for action in command._actions
            if not isinstance(action, argparse._HelpAction)
            for option in action.option_strings
        }
        if flags != documented[name]:
            wrong[name] = {
                "undocumented": flags - documented[name],
                "stale": documented[name] - flags,
            }
    assert not wrong, f"docs/commands.md's synopsis and the parsers differ: {wrong}"


def test_the_counts_of_model_types_are_the_table_s():
    """docs/support.md's table has a row for each model type with a tiny config (and the Hadamard
    packs, configured beside their writer); the counts the README and docs/support.md quote are its
    rows, its rows verified against transformers ("yes") and the model files refused."""
    from fixtures import TINY_CONFIGS
    from fixtures.hadamard_pack import hadamard_pack_config
    from streamer.families.model_types import REFUSED

    support = (ROOT / "docs" / "support.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)`[^|]*\|[^|]*\|[^|]*\| (\w+)", support, re.M)
    rows = rows[1:]  # under the header
    assert {name for name, _ in rows} == {*TINY_CONFIGS, hadamard_pack_config()["model_type"]}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"{len(rows)} model types stream" in readme
    prose = " ".join(support.split())  # a sentence may run over lines
    assert f"{len(rows)} model_types stream" in prose
    verified = sum(answer == "yes" for _, answer in rows)
    assert f"; {verified} of them are verified against transformers" in prose
    assert f"{len(REFUSED)} model file is refused" in prose


def test_the_readme_s_python_api_is_the_code_s():
    """The README's Python API names every argument of `load`, lists mlx-lm's GenerationResponse
    fields, which Response has, and generate's fourth positional argument is max_tokens."""
    import inspect

    import streamer

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("\n## Python API\n") :]
    section = section[: section.index("\n## ", 1)]
    # named as code (`threads=`): a bare word matched prose ("two threads at once")
    named = set(re.findall(r"`(\w+)", section))
    unnamed = [p for p in list(inspect.signature(streamer.load).parameters)[1:] if p not in named]
    assert not unnamed, f"the README's Python API does not name load's {unnamed}"
    fields = section.split("`GenerationResponse` fields (")[1].split(")")[0]
    listed = set(re.findall(r"`(\w+)`", fields))
    mlx_lm_response = importlib.import_module("mlx_lm.generate").GenerationResponse
    assert listed == set(mlx_lm_response.__dataclass_fields__), "not mlx-lm's fields"
    response = streamer.Response
    assert all(f in response.__dataclass_fields__ or hasattr(response, f) for f in listed)
    assert list(inspect.signature(streamer.generate).parameters)[3] == "max_tokens"
    assert list(inspect.signature(streamer.stream_generate).parameters)[3] == "max_tokens"


def test_the_readme_gives_the_demo_model_s_size():
    """The README gave the demo model as 5.6 MB: its files hold 5.8 MB (5.6 MiB), and sizes are
    written in binary units everywhere else."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"\(`streamer/demo_model/`, ([\d.]+) MiB\)", readme)
    assert stated, "the README gives no size in MiB for the demo model"
    files = sum(p.stat().st_size for p in (PACKAGE / "demo_model").iterdir())
    assert stated[1] == f"{files / 2**20:.1f}"
