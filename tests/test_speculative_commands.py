"""--draft-model, --prompt-lookup and --num-draft-tokens on generate, chat and serve, and a
request's num_draft_tokens: the text is what decoding without drafts prints."""

from __future__ import annotations

import pytest

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.cli import main
from streamer.server.api import Sampling, parse_completion
from streamer.server.engine import Engine
from streamer.server.fields import ApiError
from streamer.server.jobs import Done, Job, Step
from streamer.server.responses import stats_json

PROMPT = "def read_config(path):"


@pytest.fixture(scope="module")
def folder(checkpoints):
    return checkpoints.repacked(checkpoints.mlx("qwen3_moe"))


@pytest.fixture(scope="module")
def draft_folder(checkpoints):
    """A random model with the fixtures' tokenizer: a draft for the CLI to load."""
    return checkpoints.made(
        checkpoints.root / "draft-qwen3_moe-seed2",
        lambda path: write_hf_checkpoint(path, tiny_config("qwen3_moe"), seed=2),
    )


def cli_generate(capsys, folder, *flags: str) -> tuple[str, str]:
    argv = ["generate", "--model", str(folder), "--prompt", PROMPT, "--max-tokens", "24"]
    assert main([*argv, "--ignore-chat-template", *flags]) == 0
    out = capsys.readouterr()
    return out.out, out.err


def test_generate_with_drafts_prints_the_same_text(folder, draft_folder, capsys):
    plain, stats = cli_generate(capsys, folder)
    assert "drafts" not in stats
    for flags in (
        ["--draft-model", str(draft_folder), "--num-draft-tokens", "2"],
        ["--prompt-lookup"],
        ["--prompt-lookup", "1", "--num-draft-tokens", "6"],
    ):
        text, stats = cli_generate(capsys, folder, *flags)
        assert text == plain, flags
        assert "kept per pass" in stats and "decode: 24 tokens" in stats, flags


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--draft-model", "d", "--prompt-lookup"], "not both"),
        (["--num-draft-tokens", "2"], "--num-draft-tokens drafts with --draft-model"),
        (["--prompt-lookup", "--num-draft-tokens", "0"], "--num-draft-tokens must be at least 1"),
        (["--prompt-lookup", "0"], "--prompt-lookup must be at least 1"),
        # serve's default for requests that may ask 64 at most (400 past it), as the API's
        (["--prompt-lookup", "--num-draft-tokens", "65"], "--num-draft-tokens must be at most 64"),
        (["--prompt-lookup", "--max-kv-size", "8"], "--max-kv-size cannot be combined with"),
    ],
)
def test_bad_drafting_flags_are_refused_before_loading(flags, message, capsys):
    for command in ("generate", "chat", "serve"):
        if "--max-kv-size" in flags and command != "generate":
            continue  # generate's flag only
        argv = [command, "--model", "no-such-folder", *flags]
        assert main(argv + (["--prompt", "x"] if command == "generate" else [])) == 2
        err = capsys.readouterr().err
        assert message in err and "no-such-folder" not in err and len(err.splitlines()) == 1


def engine_text(engine: Engine, tokenizer, body: dict) -> tuple[str, Done]:
    request = parse_completion(body, chat=False, model="m", defaults=Sampling())
    prompt = tokenizer.encode(PROMPT)
    job = engine.submit(Job(request, prompt, request.max_tokens))
    pieces = []
    while not isinstance(event := job.events.get(timeout=120), Done):
        assert isinstance(event, Step), event
        pieces.append(event.piece.content)
    return "".join(pieces), event


def test_the_server_drafts_unless_a_request_says_num_draft_tokens_0(folder):
    model, tokenizer = streamer.load(folder, memory_budget=0)
    want = streamer.generate(model, tokenizer, PROMPT, 16)
    engine = Engine(model, tokenizer, 2, options={"prompt_lookup": 2, "num_draft_tokens": 4})
    body = {"prompt": PROMPT, "max_tokens": 16}
    text, done = engine_text(engine, tokenizer, body)
    assert text == want and done.stats.drafts is not None
    figures = stats_json(done.stats)  # a response's `streamer` field
    assert "drafts_kept" in figures and figures["tokens_per_pass"] >= 1
    # the same prompt again: from the prompt cache, which the drafter sees too
    text, done = engine_text(engine, tokenizer, body)
    assert text == want and done.cached_tokens > 0 and done.stats.drafts is not None
    text, done = engine_text(engine, tokenizer, {**body, "num_draft_tokens": 0})
    assert text == want and done.stats.drafts is None
    assert "drafts_kept" not in stats_json(done.stats)
    engine.close()
    with pytest.raises(ApiError, match="num_draft_tokens"):
        parse_completion(
            {**body, "num_draft_tokens": -1}, chat=False, model="m", defaults=Sampling()
        )


def test_chat_with_prompt_lookup_answers_as_without(folder):
    """Two turns (the second from the first's kept KV cache): the answers chat gives plainly."""
    from test_chat import run_chat

    lines = ["def read_config(path):", "/stats", "import os", "/stats"]
    plain = run_chat(folder, lines)
    drafted = run_chat(folder, lines, "--prompt-lookup", "2", "--num-draft-tokens", "4")
    assert plain.returncode == drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == plain.stdout and plain.stdout.count("\n") == 2
    assert "kept per pass" in drafted.stderr and "kept per pass" not in plain.stderr
