"""--prompt-cache-dir on a disk that fills: a bound the disk cannot hold is refused at start, a
cache file is not written where it would leave the disk short (the answer is unaffected, the log
says so once), a write that fails part way leaves nothing that is loaded later, and the folder's
files never pass their bound, even while a new one goes in."""

from __future__ import annotations

import errno
import json
import logging
import os

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache
from test_prompt_cache_dir import ask, engine_over, files

import streamer
from streamer.server import disk_cache as disk_module
from streamer.server import disk_files
from streamer.server.disk_files import DISK_RESERVE, PARTIAL


@pytest.fixture(scope="module")
def local(checkpoints):
    return streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def test_a_bound_the_disk_cannot_hold_is_refused_before_loading(tmp_path, capsys):
    from streamer.cli import main

    folder = tmp_path / "caches"
    argv = ["serve", "--model", "/nonexistent", "--prompt-cache-dir", str(folder)]
    assert main([*argv, "--prompt-cache-disk", "1000000T"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "streamer: error: --prompt-cache-disk 1000000.00"
    )
    assert f"does not fit on the disk of {folder}" in err and "or less" in err
    assert not folder.exists()


def test_a_short_disk_costs_the_cache_not_the_answer(local, tmp_path, monkeypatch, caplog):
    model, tokenizer = local
    want = streamer.generate(model, tokenizer, "import os", 6)
    engine = engine_over(local, tmp_path)
    monkeypatch.setattr(disk_files, "free_bytes", lambda folder: DISK_RESERVE)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        for _ in range(3):
            assert ask(engine, "import os")[0] == want
    assert files(tmp_path) == [] and not list(tmp_path.glob(f"{PARTIAL}*"))
    short = [r for r in caplog.records if "until its disk has 1.00 GiB free" in r.getMessage()]
    assert len(short) == 1  # once, not at every request of a server up for days
    monkeypatch.undo()
    ask(engine, "import sys")
    assert len(files(tmp_path)) == 1 and not engine.disk.short_of_disk


def test_a_write_that_runs_out_of_space_leaves_nothing(local, tmp_path, monkeypatch):
    model, tokenizer = local
    real = disk_module.save_prompt_cache

    def disk_full(name, cache, metadata):
        real(name, cache, metadata)
        with open(name, "r+b") as f:
            f.truncate(100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_module, "save_prompt_cache", disk_full)
    text, done = ask(engine_over(local, tmp_path), "import os")
    assert text == streamer.generate(model, tokenizer, "import os", 6)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert ask(engine_over(local, tmp_path), "import os")[1].cached_tokens == 0


def test_the_files_never_pass_their_bound(local, tmp_path, monkeypatch):
    ask(engine_over(local, tmp_path), "import os")
    (size,) = {p.stat().st_size for p in files(tmp_path)}
    engine = engine_over(local, tmp_path, max_bytes=2 * size + size // 2)  # two fit
    held = []
    real = disk_module.fsync_dir

    def counted(folder):  # just after a new file is renamed in
        held.append(sum(p.stat().st_size for p in files(tmp_path)))
        real(folder)

    monkeypatch.setattr(disk_module, "fsync_dir", counted)
    for text in ("import sys", "import re", "import json", "import math"):
        ask(engine, text)
    assert len(held) == 4 and max(held) <= 2 * size + size // 2


def test_a_folder_that_cannot_be_synced_keeps_the_file_and_says_so(
    local, tmp_path, monkeypatch, caplog
):
    """The folder's fsync failing after the rename: the log said the prompt cache was "not
    written" while the file was in place (and read at the next start), and this engine did not
    list it."""

    def failed(folder):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(disk_module, "fsync_dir", failed)
    engine = engine_over(local, tmp_path)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        ask(engine, "import os")
    (written,) = files(tmp_path)
    assert list(engine.disk.entries) == [written]
    assert caplog.messages == [
        f"prompt cache written to {tmp_path}, but its folder could not be synced (Input/output "
        "error): a power loss may lose it"
    ]
    monkeypatch.undo()
    assert ask(engine_over(local, tmp_path), "import os")[1].cached_tokens > 0


def test_a_file_removed_by_another_server_once_loaded_is_still_used(local, tmp_path, monkeypatch):
    """Another server sharing the folder removed a file just after this one loaded it: marking
    it recently used raised FileNotFoundError, and the request failed (500)."""
    model, tokenizer = local
    ask(engine_over(local, tmp_path), "import os")
    real = disk_module.load_prompt_cache

    def then_removed(name, **kwargs):
        loaded = real(name, **kwargs)
        os.unlink(name)
        return loaded

    monkeypatch.setattr(disk_module, "load_prompt_cache", then_removed)
    text, done = ask(engine_over(local, tmp_path), "import os")
    assert text == streamer.generate(model, tokenizer, "import os", 6)
    assert done.cached_tokens == done.prompt_tokens - 1


def test_a_file_removed_by_another_server_while_listed_is_not_called_damaged(
    local, tmp_path, monkeypatch, caplog
):
    """Another server sharing the folder removed a file between this one's listing and its
    reading at start: logged as a damaged file, removed."""
    ask(engine_over(local, tmp_path), "import os")
    real = disk_module.header_entry

    def then_removed(path, identity):
        os.unlink(path)
        return real(path, identity)

    monkeypatch.setattr(disk_module, "header_entry", then_removed)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        assert engine_over(local, tmp_path).disk.entries == {}
    assert caplog.text == ""


def test_a_file_removed_by_another_server_while_read_is_not_called_damaged(
    local, tmp_path, monkeypatch, caplog
):
    """Another server sharing the folder removed a file after its crc32 was read and before mlx
    opened it (seen with three servers on one folder): mlx's "Failed to open file" was logged
    as a damaged file, removed."""
    model, tokenizer = local
    ask(engine_over(local, tmp_path), "import os")
    real = disk_module.load_prompt_cache

    def removed_first(name, **kwargs):
        os.unlink(name)
        return real(name, **kwargs)

    monkeypatch.setattr(disk_module, "load_prompt_cache", removed_first)
    with caplog.at_level(logging.WARNING, logger="streamer.server"):
        text, done = ask(engine_over(local, tmp_path), "import os")
    assert text == streamer.generate(model, tokenizer, "import os", 6) and done.cached_tokens == 0
    assert "damaged" not in caplog.text


def test_a_disk_that_cannot_be_asked_is_one_line(tmp_path, monkeypatch, capsys):
    from streamer.cli import main

    def denied(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(disk_files.shutil, "disk_usage", denied)
    folder = tmp_path / "caches"
    assert main(["chat", "--model", "/nonexistent", "--prompt-cache-dir", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"streamer: error: --prompt-cache-dir {folder}: Permission denied\n"
    )


def test_a_conversation_holds_each_token_once(local, tmp_path):
    """Each turn's file held the turns before: a long chat filled the bound with its own
    prefixes and pushed out every other cache (mlx-lm drops them from its memory cache). Each
    turn's file now holds its new tokens, continuing the file before."""
    model, _ = local
    engine = engine_over(local, tmp_path)
    other = [7, 8, 9]
    turns = [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7]]
    for tokens in [other, *turns]:
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([tokens]), cache=cache))
        engine.disk.save(tokens, cache)
    own = sorted(entry.own for entry in engine.disk.entries.values())
    assert own == [(1, 2, 3), (4, 5), (6, 7), (7, 8, 9)] and len(files(tmp_path)) == 4
    assert engine.disk.fetch([1, 2, 3, 4, 9], longer_than=0)[1] == 4  # cut back to the prefix


def test_a_cache_already_on_disk_is_not_written_again(local, tmp_path, monkeypatch):
    """The same answer again (or a turn asked again, held by a longer file) rewrote the file:
    a server's disk written through, each time, while the next request waited."""
    real, written = disk_module.save_prompt_cache, []

    def counted(name, cache, metadata):
        written.append(metadata["streamer_tokens"])
        real(name, cache, metadata)

    monkeypatch.setattr(disk_module, "save_prompt_cache", counted)
    engine = engine_over(local, tmp_path)
    for _ in range(3):
        ask(engine, "import os")
    assert len(written) == 1 and len(files(tmp_path)) == 1
    model, _ = local
    cache = make_prompt_cache(model)
    tokens = json.loads(written[0])[:3]  # a prefix of the file's: it cuts back to it
    mx.eval(model(mx.array([tokens]), cache=cache))
    engine.disk.save(tokens, cache)
    assert len(written) == 1


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_a_prompt_cache_dir_under_a_group_is_refused_before_loading(
    tmp_path, monkeypatch, capsys, command
):
    """--prompt-cache-dir is for one process: under mlx.launch it was refused once every rank had
    loaded the model (open_engine), where its other checks come before the load."""
    from streamer.cli import main
    from streamer.parallel import group

    monkeypatch.setattr(group, "launched_group", mx.distributed.init)  # as under mlx.launch
    argv = [command, "--model", "no-such-folder", "--prompt-cache-dir", str(tmp_path / "c")]
    assert main([*argv, "--port", "0"] if command == "serve" else argv) == 2
    err = capsys.readouterr().err
    assert "--prompt-cache-dir is for one process" in err and "no-such-folder" not in err
