"""--prompt-cache-dir on a machine shared with other users: cache files (a conversation's tokens)
are this user's alone, a link planted under a name about to be written is not written through,
and a folder other users may write to (or own) is refused at start."""

from __future__ import annotations

import os
import stat

import pytest
from test_prompt_cache_dir import ask, engine_over, files

import streamer
from streamer.server import disk_cache as disk_module
from streamer.server import disk_files


@pytest.fixture(scope="module")
def local(checkpoints):
    return streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


@pytest.fixture
def open_umask():
    old = os.umask(0o022)  # the usual one: files readable by every user unless made otherwise
    yield
    os.umask(old)


def test_cache_files_and_a_new_folder_are_private(local, tmp_path, open_umask):
    folder = tmp_path / "caches"
    ask(engine_over(local, folder), "import os")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (path,) = files(folder)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_link_planted_at_the_name_being_written_is_not_followed(local, tmp_path, monkeypatch):
    model, tokenizer = local
    names = []

    def refused(name, cache, metadata):  # the name a write of this conversation goes to
        names.append(name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_module, "save_prompt_cache", refused)
    ask(engine_over(local, tmp_path), "import os")
    monkeypatch.undo()
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("another user's file")
    os.symlink(victim, names[0])
    text, _ = ask(engine_over(local, tmp_path), "import os")
    assert text == streamer.generate(model, tokenizer, "import os", 6)
    assert victim.read_text() == "another user's file" and files(tmp_path) == []


def test_a_folder_any_user_may_write_is_refused(tmp_path, capsys):
    from streamer.cli import main

    tmp_path.chmod(0o1777)  # as /tmp
    argv = ["serve", "--model", "/nonexistent", "--prompt-cache-dir", str(tmp_path)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"streamer: error: --prompt-cache-dir {tmp_path} may be written by any user (mode 1777), "
        f"who could plant cache files in it: give a folder of your own, or `chmod o-w {tmp_path}`."
        "\n"
    )


def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch, capsys):
    from streamer.cli import main

    monkeypatch.setattr(disk_files.os, "getuid", lambda: tmp_path.stat().st_uid + 1)
    assert main(["chat", "--model", "/nonexistent", "--prompt-cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "belongs to another user" in err


def test_a_folder_this_user_cannot_write_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    """A read-only folder (its permissions, or a read-only disk) was refused once the model was
    loaded, saying only "not writable"."""
    from streamer.cli import main

    real_access = os.access
    monkeypatch.setattr(
        disk_files.os, "access", lambda path, mode: path != tmp_path and real_access(path, mode)
    )
    assert main(["chat", "--model", "/nonexistent", "--prompt-cache-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"streamer: error: --prompt-cache-dir {tmp_path} is not writable (its permissions, or a "
        "read-only disk): give a folder you may write to.\n"
    )


def test_a_folder_to_make_where_it_cannot_be_made_is_refused_before_loading(
    tmp_path, monkeypatch, capsys
):
    """A folder not made yet under one this user cannot write (a link to a read-only disk, say),
    or under a link to nothing, passed the checks: refused once the model was loaded, by
    mkdir's "Read-only file system" or "File exists"."""
    from streamer.cli import main

    real_access = os.access
    monkeypatch.setattr(
        disk_files.os, "access", lambda path, mode: path != tmp_path and real_access(path, mode)
    )
    folder = tmp_path / "caches" / "serve"
    assert main(["chat", "--model", "/nonexistent", "--prompt-cache-dir", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"streamer: error: --prompt-cache-dir {folder} cannot be made: {tmp_path} is not "
        "writable (its permissions, or a read-only disk): give a folder you may write to.\n"
    )
    monkeypatch.undo()
    (tmp_path / "broken").symlink_to("/nonexistent")
    folder = tmp_path / "broken" / "caches"
    assert main(["serve", "--model", "/nonexistent", "--prompt-cache-dir", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"streamer: error: --prompt-cache-dir {folder}: {tmp_path / 'broken'} is a link to "
        "/nonexistent, which does not exist: give a folder.\n"
    )
