"""A chat_template list in transformers' named form, [{"name": ..., "template": ...}], that is
malformed: refused naming the file and the entry, not as a tokenizer.json fault (KeyError) or
without a word (a name given twice, a template that is not text)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import streamer
from streamer.errors import StreamerError
from streamer.loading.tokenizer import load_tokenizer

DEMO = Path(streamer.__file__).parent / "demo_model"
GOOD = {"name": "default", "template": "{{ messages[0]['content'] }}"}


def with_templates(tmp_path: Path, templates: object) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(DEMO, folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = templates
    path.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "templates, fault",
    [
        ([GOOD, {"name": "tool_use"}], "entry 1 template is missing, not text"),
        ([{"template": "x"}], "entry 0 name is missing, not text"),
        (["{{ x }}"], "entry 0 is str, not an object"),
        ([GOOD, {**GOOD, "template": "other"}], "entry 1 names 'default' again"),
        ([{"name": "default", "template": 5}], "entry 0 template is int, not text"),
        ([{"name": None, "template": "x"}], "entry 0 name is null, not text"),
    ],
)
def test_a_malformed_named_template_list_names_the_file_and_entry(tmp_path, templates, fault):
    folder = with_templates(tmp_path, templates)
    with pytest.raises(StreamerError) as refused:
        load_tokenizer(folder, trust_remote_code=False)
    message = str(refused.value)
    assert message.startswith(f"{folder / 'tokenizer_config.json'}: chat_template: {fault};")
    assert "\n" not in message and "tokenizer.json" not in message.replace("_config.json", "")


def test_an_empty_named_template_list_is_refused(tmp_path):
    """`[]`: every render failed ("multiple chat templates with no default specified")."""
    folder = with_templates(tmp_path, [])
    with pytest.raises(StreamerError, match="chat_template: the list names no template; give"):
        load_tokenizer(folder, trust_remote_code=False)


def test_the_users_tokenizer_config_template_is_the_one_checked(tmp_path):
    """The user's chat_template replaces the file's: its faults are named, the file's are not."""
    folder = with_templates(tmp_path, [{"name": "default"}])
    tokenizer = load_tokenizer(folder, False, tokenizer_config={"chat_template": [GOOD]})
    assert tokenizer.chat_template == {"default": GOOD["template"]}
    with pytest.raises(StreamerError, match="^tokenizer_config's chat_template: entry 0 is int"):
        load_tokenizer(DEMO, False, tokenizer_config={"chat_template": [1]})


def test_a_template_file_replaces_the_list_and_a_good_list_loads(tmp_path):
    folder = with_templates(tmp_path, [{"name": "default"}])
    (folder / "chat_template.jinja").write_text(GOOD["template"])
    assert load_tokenizer(folder, False).chat_template == GOOD["template"]
    folder = with_templates(tmp_path / "good", [GOOD, {**GOOD, "name": "tool_use"}])
    assert set(load_tokenizer(folder, False).chat_template) == {"default", "tool_use"}
