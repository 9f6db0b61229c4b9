"""Facts of each command's --help, as a user reads them beside mlx-lm's: the usage line agrees
with what the command requires."""

from __future__ import annotations

import argparse
import importlib
import inspect
import re

import pytest

from streamer.cli import main, parser
from streamer.cli.mlx_lm_flags import MLX_LM_ONLY


def _commands() -> dict[str, argparse.ArgumentParser]:
    top = parser()
    return dict(top._subparsers._group_actions[0].choices)


@pytest.mark.parametrize("command", sorted(_commands()))
def test_usage_brackets_exactly_the_optional_options(command):
    p = _commands()[command]
    usage = " ".join(p.format_usage().split())
    for action in p._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        shown = action.option_strings[0]
        bracketed = re.search(rf"\[{re.escape(shown)}[\s\]]", usage) is not None
        assert bracketed != action.required, (command, shown, usage)


def test_a_missing_model_points_at_the_demo(capsys):
    """`generate --help` showed `[--model MODEL]`, though leaving it out was an error; chat and
    serve, where it shows required, did not point at the demo."""
    for command in ("generate", "chat", "serve"):
        assert _commands()[command]._option_string_actions["--model"].required
    for command in ("generate", "chat", "serve"):
        assert main([command, "--prompt", "hi"] if command == "generate" else [command]) == 2
        err = capsys.readouterr().err
        assert "--model" in err and "streamer demo" in err and len(err.splitlines()) == 1, err


def test_launch_help_says_streamer_s_usage_before_mlx_launch_s_options(capsys):
    """`streamer launch --help` printed mlx.launch's help alone, which says nothing of the
    streamer command after `--`."""
    with pytest.raises(SystemExit) as ended:
        main(["launch", "--help"])
    assert ended.value.code == 0
    out = capsys.readouterr().out
    assert "-- generate --model" in out and "--hostfile" in out
    assert out.index("-- COMMAND") < out.index("--hostfile"), out


@pytest.mark.parametrize(
    ("command", "theirs"), [("generate", "generate"), ("chat", "chat"), ("serve", "server")]
)
def test_every_flag_of_mlx_lm_s_command_is_taken_or_refused_with_why(command, theirs):
    """chat lacked mlx_lm.chat's --max-kv-size and --prefill-step-size, serve mlx_lm.server's
    --prefill-step-size: "unrecognized arguments", with a did-you-mean of another flag."""
    source = inspect.getsource(importlib.import_module(f"mlx_lm.{theirs}"))  # server: in main
    flags = set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', source))
    ours = _commands()[command]._option_string_actions
    assert len(flags) > 10
    assert not [f for f in sorted(flags) if f not in ours and f not in MLX_LM_ONLY]


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_a_bad_prefill_step_is_refused_before_loading(command, capsys):
    argv = [command, "--model", "/nonexistent", "--prefill-step-size", "0"]
    assert main(argv + ["-p", "hi"] if command == "generate" else argv) == 2
    err = capsys.readouterr().err
    assert "--prefill-step-size must be at least 1" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("command", sorted(_commands()))
def test_sizes_show_the_size_metavar(command):
    """--memory-budget showed MEMORY_BUDGET beside --prompt-cache-bytes SIZE; plan's --memory
    MEMORY."""
    from streamer.cli.options import size

    for action in _commands()[command]._actions:
        if action.type is size:
            assert action.metavar == "SIZE", (command, action.option_strings)


@pytest.mark.parametrize("command", sorted(_commands()))
def test_names_the_help_uses_are_the_usage_s(command):
    """repack's help said "replace DST" and "SRC's shards" under a usage of `src dst`; verify's
    "not in DIR" under `dir`."""
    p = _commands()[command]
    shown = {a.metavar or a.dest.upper() for a in p._actions if not a.option_strings}
    shown |= {a.metavar for a in p._actions if a.option_strings and a.metavar}
    said = {w for a in p._actions for w in re.findall(r"\b(SRC|DST|DIR)\b", a.help or "")}
    named = [a for a in p._actions if not a.option_strings and a.nargs != argparse.REMAINDER]
    assert said <= shown and all(a.metavar for a in named), command  # launch's: mlx.launch's


@pytest.mark.parametrize(
    ("flags", "said"),
    [  # mlx_lm.convert's spellings: "write --quantize=--q-bits", "did you mean --group-size?"
        (["--quantize", "--q-bits", "4"], "--quantize takes the bits: --quantize 4"),
        (["--hf-path", "x"], "repack takes the folders as SRC DST"),
        (["--q-group-size", "32"], "--q-mode and --group-size choose how --quantize quantizes"),
    ],
)
def test_mlx_lm_convert_s_spellings_are_taken_or_told(flags, said, capsys):
    assert main(["repack", "a", "b", *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and "write --" not in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("genrate", "generate"), ("server", "serve"), ("convert", "repack"), ("run", "chat")],
)
def test_a_mistyped_command_or_another_tool_s_is_told_ours(typed, meant, capsys):
    """`streamer genrate` listed the commands without a did-you-mean, as an option's typo has;
    mlx_lm.convert's and Ollama's command names were only "invalid choice"."""
    assert main([typed, "--help"]) == 2
    err = capsys.readouterr().err
    assert f"(did you mean {meant}?)" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("command", ["chat", "serve"])
@pytest.mark.parametrize("flag", ["--prompt", "-p", "--prompt=hi"])
def test_a_prompt_given_to_chat_or_serve_says_where_prompts_go(command, flag, capsys):
    """`streamer chat --prompt hi`, as generate takes it, said "ambiguous option: --prompt could
    match --prompt-cache-dir, ..."; `-p hi` "unrecognized arguments: -p"."""
    given = [flag] if "=" in flag else [flag, "hi"]
    assert main([command, "--model", "/nonexistent", *given]) == 2
    err = capsys.readouterr().err
    assert f"{command} takes no prompt" in err and "ambiguous" not in err, err
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("command", sorted(_commands()))
def test_each_command_s_help_says_what_it_does(command):
    """`streamer pull --help` began with the usage and the options: the line `streamer --help`
    gives each command was not said."""
    top = parser()
    summary = next(
        a.help for a in top._subparsers._group_actions[0]._choices_actions if a.dest == command
    )
    said = " ".join(_commands()[command].format_help().split())
    assert " ".join(summary.split()) in said, (command, said[:300])


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_the_many_options_are_grouped_by_what_they_set(command):
    """generate's 30 options were one list under "options:": sampling, the KV cache, drafting
    and loading each have their heading, as mlx_lm.server's and llama.cpp's help groups them."""
    p = _commands()[command]
    groups = {
        g.title: {o for a in g._group_actions for o in a.option_strings} for g in p._action_groups
    }
    assert {"--kv-bits", "--quantized-kv-start"} <= groups["KV cache"]
    assert {"--draft-model", "--prompt-lookup", "--num-draft-tokens"} <= groups[
        "speculative decoding"
    ]
    assert {"--memory-budget", "--dtype", "--read-path", "--verify-reads"} <= groups["loading"]
    if command != "serve":  # serve's are a request's defaults, beside its other defaults
        assert {"--temp", "--top-p", "--top-k", "--min-p", "--seed"} <= groups["sampling"]
    else:
        assert {"--prompt-cache-size", "--prompt-cache-dir"} <= groups["prompt caches"]


def test_streamer_alone_lists_the_commands(capsys):
    """`streamer` with nothing said "the following arguments are required: command": a first run
    gets what `streamer --help` gives, as `ollama` and `lms` alone do."""
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: streamer") and all(c in out for c in _commands()), out


def test_the_commands_are_listed_in_the_order_a_first_run_takes_them():
    """`streamer --help` began with pull, repack, split and verify; the README's first run is
    demo, then plan, pull, generate, chat and serve, each in the order it gives them."""
    first_run = ["demo", "plan", "pull", "generate", "chat", "serve"]
    assert list(_commands())[: len(first_run)] == first_run


def test_pull_s_help_gives_where_this_machine_repacks(tmp_path, monkeypatch):
    """--dst's default was written as ~/.cache/streamer/models/org--name, which is not where a Mac
    (~/Library/Caches/streamer) or $STREAMER_CACHE_DIR puts it."""
    monkeypatch.setenv("STREAMER_CACHE_DIR", str(tmp_path / "cache"))
    said = "".join(_commands()["pull"].format_help().split())  # argparse wraps the path
    assert f"(default:{tmp_path / 'cache' / 'models'}/org--name" in said, said


@pytest.mark.parametrize("command", [["chat"], ["serve"], ["generate", "-p", "hi"]])
def test_a_model_given_as_ollama_gives_it_is_shown_as_an_option(command, capsys):
    """`streamer chat MODEL`, as `ollama run MODEL` and `lms load MODEL` take it, said only that
    --model is required."""
    assert main([command[0], "my-model", *command[1:]]) == 2
    err = capsys.readouterr().err
    assert "give the model as --model my-model" in err and len(err.splitlines()) == 1, err
