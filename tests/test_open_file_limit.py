"""A hard open-file limit below 4096 (`ulimit -n 1024` as a user, a container's): mlx-lm's import
sets (2048, 4096) and raised `ValueError: not allowed to raise maximum limit`, a traceback from
generate, chat and serve. The limit is lowered in the child before it runs; as root, the child
also loses CAP_SYS_RESOURCE, without which it cannot raise the hard limit back, as a user cannot."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

STREAMER = [sys.executable, "-m", "streamer"]


@pytest.fixture(scope="module")
def model(checkpoints) -> str:
    return str(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def limited(
    command: list[str], soft: int, hard: int, stdin: str = ""
) -> subprocess.CompletedProcess:
    """`command` run under the open-file limits (soft, hard), which it cannot raise."""
    if os.geteuid() == 0:
        command = ["setpriv", "--bounding-set", "-sys_resource", "--inh-caps=-all", *command]
    return subprocess.run(
        command,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
    )


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_hard_limit_below_mlx_lms_runs(model, command):
    words = ["--prompt", "hi"] if command == "generate" else []
    done = limited([*STREAMER, command, "--model", model, "--max-tokens", "3", *words], 512, 1024)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_the_soft_limit_is_raised_as_far_as_the_hard_one():
    """mlx-lm asks for 2048 descriptors: it gets as many as the hard limit allows."""
    show = "import streamer, mlx_lm, resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"
    done = limited([sys.executable, "-c", show], 512, 1024)
    assert done.stdout.strip() == "(1024, 1024)", done.stderr


def test_a_limit_too_low_for_the_model_is_refused_in_one_line(model):
    done = limited([*STREAMER, "generate", "--model", model, "--prompt", "hi"], 40, 40)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "expert files open" in line and "run `ulimit -n 4096`" in line, line
