"""Checkpoints made wrong for the bad-input tests: a private copy to break, and the check that a
repack of it is refused in one line naming what is wrong, with nothing left behind."""

from __future__ import annotations

import shutil

import pytest

from streamer.errors import StreamerError
from streamer.repack import repack


def copy_checkpoint(src, tmp_path):
    dst = tmp_path / "src"
    shutil.copytree(src, dst)
    return dst


def assert_refused(src, tmp_path, *patterns: str, **kwargs) -> str:
    """The one-line message refusing a repack of `src`, which holds every pattern."""
    dst = tmp_path / "out"
    with pytest.raises(StreamerError) as err:
        repack(src, dst, log=lambda _: None, **kwargs)
    message = str(err.value)
    for pattern in patterns:
        assert pattern in message, message
    assert "\n" not in message, "an error is one line"
    assert not dst.exists()
    assert not list(tmp_path.glob(".out*")), "a partial output was left behind"
    return message
