"""Bad generation input: a prompt past the context, a bad max_tokens or memory budget, prompt bytes
that are not UTF-8; refused in one line, by the library or by the CLI before it loads anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import streamer
from streamer.cli import main
from streamer.errors import StreamerError


def test_prompt_longer_than_the_context(checkpoints):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    long = " ".join(f"w{i}" for i in range(2100))
    with pytest.raises(
        StreamerError, match=r"the prompt is \d+ tokens but the model's context is 2048 tokens"
    ):
        streamer.generate(model, tokenizer, long, max_tokens=1)
    prompt = [1 + i % 500 for i in range(2039)]  # ids the model has
    with pytest.raises(StreamerError, match="max_tokens is 100.*lower max_tokens to at most 9"):
        streamer.generate(model, tokenizer, prompt, max_tokens=100)
    with pytest.raises(StreamerError, match="max_tokens must be at least 1"):
        streamer.generate(model, tokenizer, "hello", max_tokens=-3)


def test_the_command_line_names_its_flag_past_the_context(checkpoints, capsys):
    """`generate -m 5000` said "max_tokens is 5000 ...: lower max_tokens", the Python API's name."""
    folder = str(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    assert main(["generate", "--model", folder, "-p", "hi", "-m", "5000"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "and --max-tokens is 5000" in err and "lower --max-tokens to at most" in err, err


def test_a_reused_prompt_cache_counts_toward_the_context(checkpoints):
    """The tokens a passed prompt_cache holds come before the prompt's positions: they were not
    counted, so a call past the context (2048) ran into positions the model was never trained on."""
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    cache = make_prompt_cache(model)
    streamer.generate(model, tokenizer, [1 + i % 500 for i in range(2000)], 1, prompt_cache=cache)
    held = cache[0].offset
    assert held >= 2000
    with pytest.raises(
        StreamerError,
        match=rf"the prompt is 30 tokens after the {held} tokens prompt_cache holds and "
        rf"max_tokens is 40, but the model's context is 2048 tokens .*at most {2048 - held - 30} "
        "or shorten the prompt or start a new prompt_cache",
    ):
        streamer.generate(model, tokenizer, list(range(1, 31)), 40, prompt_cache=cache)
    with pytest.raises(
        StreamerError, match=rf"the prompt is 60 tokens after the {held} tokens .* but"
    ):
        streamer.generate(model, tokenizer, list(range(1, 61)), 1, prompt_cache=cache)
    assert streamer.generate(model, tokenizer, [5], 2, prompt_cache=cache)  # what fits runs


def test_a_vision_language_model_s_context_is_its_text_config_s(checkpoints):
    """A VLM keeps max_position_embeddings in text_config (2048 here): the top level has none, so
    no prompt was checked against the context (nor a request by serve, nor plan's limit)."""
    from streamer.plan import plan
    from streamer.server.jobs import fit

    folder = checkpoints.repacked(checkpoints.hf("qwen3_5_moe"))
    model, tokenizer = streamer.load(folder)
    assert model.streamer.context_length == 2048
    with pytest.raises(StreamerError, match="max_tokens is 100, but the model's context is 2048"):
        streamer.generate(model, tokenizer, [1 + i % 500 for i in range(2000)], max_tokens=100)
    assert fit(2000, None, 100, model.streamer.context_length) == 48
    assert any("the model's limit is 2048" in line for line in plan(folder, 8 << 30).lines())


def test_dbrx_s_context_is_its_max_seq_len(checkpoints, tmp_path):
    """DBRX gives its context as max_seq_len (2048 here), no max_position_embeddings: no prompt
    was checked against it (nor a request by serve, nor plan's limit). A bad one is refused."""
    from streamer.families.config import check_sizes
    from streamer.plan import plan

    folder = checkpoints.repacked(checkpoints.hf("dbrx"))
    model, tokenizer = streamer.load(folder)
    assert model.streamer.context_length == 2048
    with pytest.raises(StreamerError, match=r"context is 2048 tokens \(max_seq_len in config.json"):
        streamer.generate(model, tokenizer, [1 + i % 500 for i in range(2000)], max_tokens=100)
    assert any("the model's limit is 2048" in line for line in plan(folder, 8 << 30).lines())
    with pytest.raises(StreamerError, match="max_seq_len"):
        check_sizes({"model_type": "dbrx", "max_seq_len": "2048"}, tmp_path / "config.json")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt", os.fsdecode(b"caf\xe9 \xff")], "not valid UTF-8 (byte 0xe9 at offset 3)"),
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "hi", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--prompt", "hi", "--max-tokens", "-5"], "--max-tokens must be at least 1 (got -5)"),
        (  # a traceback in the tokenizer before, with --ignore-chat-template
            ["--prompt", "hi", "--system-prompt", os.fsdecode(b"a\xffb")],
            "--system-prompt is not valid UTF-8 (byte 0xff at offset 1)",
        ),
        (  # "surrogates not allowed" from the tokenizer before, once the model had loaded
            ["--prompt", "hi", "--extra-eos-token", os.fsdecode(b"caf\xe9")],
            "--extra-eos-token is not valid UTF-8 (byte 0xe9 at offset 3)",
        ),
    ],
)
def test_cli_refuses_bad_generation_input_before_loading(argv, message, capsys):
    assert main(["generate", "--model", "/nonexistent", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("budget", ["-1G", "inf", "nan", "lots"])
def test_cli_refuses_a_bad_memory_budget(budget, capsys):
    assert main(["generate", "--model", "x", "--prompt", "hi", f"--memory-budget={budget}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamer: error: argument --memory-budget: ") and "usage:" not in err
    assert "is not a size such as 8G" in err and len(err.splitlines()) == 1


def test_cli_prompt_bytes_from_the_shell_and_stdin(checkpoints):
    """Real argv bytes (not valid UTF-8) and a prompt piped on stdin."""
    model = str(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    command = [sys.executable, "-m", "streamer", "generate", "--model", model, "--max-tokens", "2"]
    result = subprocess.run([*command, "--prompt", b"\xc3\x28 bad"], capture_output=True)
    assert result.returncode == 2 and b"not valid UTF-8 (byte 0xc3 at offset 0)" in result.stderr
    result = subprocess.run(
        [*command, "--prompt", "-"], input="caf\u00e9 au lait".encode(), capture_output=True
    )
    assert result.returncode == 0 and b"decode: 2 tokens" in result.stderr, result.stderr


def test_one_token_is_said_in_the_singular(checkpoints):
    """ "the prompt is 1 tokens" (the library, the server's fit, the stats line)."""
    from streamer.server.fields import ApiError
    from streamer.server.jobs import fit

    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    with pytest.raises(StreamerError, match="the prompt is 1 token and max_tokens is 2048, but"):
        streamer.generate(model, tokenizer, [7], max_tokens=2048)
    with pytest.raises(ApiError, match="the prompt is 1 token and max_tokens is 5, but the model"):
        fit(1, 5, 100, 4, ("prompt", "max_tokens"))
    one = list(streamer.stream_generate(model, tokenizer, [7], max_tokens=1))[-1]
    assert "prompt: 1 token, " in one.stats.line() and "decode: 1 token, " in one.stats.line()


def test_a_prompt_draws_no_tokenizer_warning(checkpoints, tmp_path):
    """tokenizer_config.json's model_max_length below the model's context: transformers logged
    "Token indices sequence length is longer than the specified maximum sequence length" (serve's
    log, generate's stderr) for a prompt the model takes; and for one past the context, beside
    streamer's one-line refusal, that running it "will result in indexing errors"."""
    import json
    import logging
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), folder)
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_max_length": 16}))
    model, tokenizer = streamer.load(folder)
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    transformers_log = logging.getLogger("transformers")  # its modules' loggers propagate to it
    transformers_log.addHandler(handler)
    try:
        prompt = " ".join(f"w{i}" for i in range(40))
        assert 16 < len(tokenizer.encode(prompt)) < 2048  # inside the context (2048)
        assert len(tokenizer.encode(prompt * 60)) > 2048  # past it: streamer refuses it itself
    finally:
        transformers_log.removeHandler(handler)
    assert not [m for m in logged if "Token indices sequence length" in m], logged
    assert tokenizer._tokenizer.model_max_length == 2048
