"""The command line, run as a user would run it."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from hostile_files import edited_copy


def run(*args: str, check: bool = True, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    """`streamer ARGS`, stderr captured; stdout captured too unless given a file or descriptor."""
    result = subprocess.run(
        [sys.executable, "-m", "streamer", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_repack_info_generate(checkpoints, tmp_path):
    dst = tmp_path / "model"
    result = run("repack", str(checkpoints.hf("qwen3_moe")), str(dst), "--quantize", "4")
    assert "layer 2/2" in result.stderr and "done" in result.stderr
    info = run("info", str(dst)).stdout
    assert (
        "qwen3_moe" in info
        and "16 per layer, 4 routed per token" in info
        and "4-bit affine, group 64" in info
    )
    args = (
        "generate",
        "--model",
        str(dst),
        "--prompt",
        "The file",
        "--max-tokens",
        "8",
        "--seed",
        "1",
        "--temp",
        "0.7",
    )
    streamed = run(*args, "--memory-budget", "0")
    assert streamed.stdout.strip()
    assert "page cache only" in streamed.stderr
    assert "decode: 8 tokens" in streamed.stderr and "syncs/token 2.0" in streamed.stderr
    resident = run(*args)  # the tiny model fits in memory: by default every layer is resident
    assert "all experts resident" in resident.stderr and "syncs/token 0.0" in resident.stderr
    assert resident.stdout == streamed.stdout  # same seed, same text


def test_demo_runs_offline():
    result = run("demo", "--max-tokens", "8")
    assert "decode: 8 tokens" in result.stderr and "page-cache hits" in result.stderr


def test_errors_exit_2_with_a_message(tmp_path):
    result = run("generate", "--prompt", "hi", check=False)
    assert result.returncode == 2 and "streamer demo" in result.stderr
    result = run("repack", str(tmp_path / "nowhere"), str(tmp_path / "out"), check=False)
    assert result.returncode == 2 and "is not a folder" in result.stderr
    assert "Traceback" not in result.stderr


def _model(checkpoints):
    return str(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def test_output_closed_by_its_reader_ends_quietly(checkpoints):
    """`streamer generate ... | head -c 3`: the reader is gone before the text is written."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    command = ["generate", "--model", _model(checkpoints), "--prompt", "x", "--max-tokens", "4"]
    result = run(*command, check=False, stdout=write_end)
    os.close(write_end)
    assert result.returncode == 141 and "Traceback" not in result.stderr, result.stderr
    assert "Exception ignored" not in result.stderr


@pytest.mark.parametrize(
    "command", ["generate", "chat", "plan"]
)  # plan's and chat's were tracebacks
def test_output_to_a_full_device_is_one_line(checkpoints, command):
    args = {
        "generate": ["--model", _model(checkpoints), "--prompt", "x", "--max-tokens", "4"],
        "chat": ["--model", _model(checkpoints), "--max-tokens", "4"],
        "plan": [_model(checkpoints)],
    }[command]
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "streamer", command, *args],
            input="hello\n",
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.endswith("streamer: error: cannot write the output: No space left on device")
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr


def test_output_in_an_encoding_without_the_generated_characters(checkpoints):
    """LANG=en_US.ISO-8859-1 or PYTHONIOENCODING=ascii: a character stdout cannot encode (the
    tiny model emits U+FFFD for a lone byte token) was a UnicodeEncodeError traceback, and chat's
    process then aborted ("terminate called without an active exception")."""
    import os

    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    sampled = ["--model", _model(checkpoints), "--max-tokens", "60", "--temp", "1", "--seed", "0"]
    for command, typed in (
        (["generate", *sampled, "--prompt", "caf\u00e9", "--ignore-chat-template"], None),
        (["chat", *sampled], "hello\n"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "streamer", *command],
            input=typed,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert "?" in result.stdout  # what ascii lacks, shown as iconv shows it


def test_sampling_arguments_are_checked_before_loading():
    for option, value, message in [
        ("--temp", "-0.5", "--temp must be 0 (greedy) or more (got -0.5)"),
        ("--temp", "nan", "--temp must be 0"),
        ("--temp", "1e-300", "--temp must be 0 (greedy) or at least 1e-05: below that the"),
        ("--top-p", "0", "--top-p must be above 0 and at most 1 (got 0.0)"),
        ("--top-p", "1.5", "--top-p must be above 0 and at most 1"),
        ("--seed", "-1", "--seed must be an integer from 0 to 18446744073709551615 (got -1)"),
        ("--seed", str(1 << 64), "--seed must be an integer from 0"),
    ]:
        result = run(
            "generate", "--model", "/nonexistent", "--prompt", "hi", option, value, check=False
        )
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "command, argv, message",
    [
        ("generate", ["--prompt", "hi", "--top-k", "-2"], "--top-k must be an integer, 0 (off)"),
        ("generate", ["--prompt", "hi", "--min-p", "1.5"], "--min-p must be from 0 (off) to 1"),
        ("generate", ["--prompt", "hi", "--max-kv-size", "4"], "--max-kv-size must be at least 5"),
        ("chat", ["--temp", "-1"], "--temp must be 0 (greedy) or more (got -1.0)"),
        ("chat", ["--max-tokens", "0"], "--max-tokens must be at least 1 (got 0)"),
        ("chat", ["--seed", "-1"], "--seed must be an integer from 0"),
        ("chat", ["--min-p", "2"], "--min-p must be from 0"),
        ("serve", ["--top-p", "5"], "--top-p must be above 0 and at most 1 (got 5.0)"),
        ("serve", ["--top-k", "-1"], "--top-k must be an integer, 0 (off)"),
        ("serve", ["--max-tokens", "-3"], "--max-tokens must be at least 1 (got -3)"),
        ("serve", ["--port", "99999"], "--port must be from 0 (any free port) to 65535"),
        ("serve", ["--prompt-cache-size", "-1"], "--prompt-cache-size must be at least 0"),
        ("serve", ["--api-key", " "], "--api-key is empty"),
        ("serve", ["--served-model-name", ""], "--served-model-name is empty"),
    ],
)
def test_every_command_checks_its_sampling_and_count_flags_before_loading(
    command, argv, message, capsys
):
    """Refused before the (missing) model is looked at: one line, no traceback."""
    from streamer.cli import main

    assert main([command, "--model", "/nonexistent", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_sizes_as_people_write_them():
    from streamer.errors import StreamerError
    from streamer.io.sizes import parse_size

    for text in ("8G", "8GB", "8GiB", "8 GB", "8 gib", "8g"):
        assert parse_size(text, "--memory-budget") == 8 << 30, text
    assert parse_size("0.5M", "x") == 1 << 19 and parse_size(4096, "x") == 4096
    assert parse_size("0", "x") == 0 and parse_size("1048576", "x") == 1 << 20
    for text in ("0.5", "1.5", " 2.25 ", "4096"):  # bytes, with no unit: 0, 1, 2, 4 KiB taken
        with pytest.raises(StreamerError, match="has no unit, so it counts bytes.*write .*G"):
            parse_size(text, "--memory-budget")
    result = run(
        "generate", "--model", "/x", "--prompt", "hi", "--memory-budget", "8 XB", check=False
    )
    assert "argument --memory-budget: '8 XB' is not a size such as 8G" in result.stderr
    result = run("plan", "/x", "--memory", "1.5", check=False)
    assert "argument --memory: '1.5' has no unit, so it counts bytes" in result.stderr


def test_info_on_a_damaged_folder(checkpoints, tmp_path):
    folder = edited_copy(
        _model(checkpoints),
        tmp_path / "model",
        lambda m: m["config"].update(num_experts_per_tok="four"),
    )
    result = run("info", str(folder), check=False)
    said = "manifest.json: config field num_experts_per_tok is 'four', expected an integer"
    assert result.returncode == 2 and said in result.stderr, result.stderr


@pytest.mark.parametrize(
    "command, status, message",
    [
        ("info", 2, "resident.safetensors is missing"),  # one line
        ("verify", 1, "streamer: bad: resident.safetensors"),  # reported as damage
    ],
)
def test_a_missing_resident_file(checkpoints, tmp_path, command, status, message):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(_model(checkpoints), folder)
    (folder / "resident.safetensors").unlink()
    result = run(command, str(folder), check=False)
    assert result.returncode == status and message in result.stderr
    assert "Traceback" not in result.stderr


def test_tokenizer_and_template_faults_are_one_line(checkpoints, tmp_path):
    import json
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(_model(checkpoints), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m.content "  # never closed
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    args = ("generate", "--model", str(folder), "--prompt", "hi", "--max-tokens", "2")
    result = run(*args, "--chat", check=False)
    assert result.returncode == 2 and "chat template fails" in result.stderr, result.stderr
    assert len([line for line in result.stderr.splitlines() if "error" in line]) == 1
    (folder / "tokenizer.json").write_text("{ not json")
    result = run(*args, check=False)
    assert result.returncode == 2 and "cannot load the tokenizer" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("streamer: error:")
    assert "Traceback" not in result.stderr
    (folder / "tokenizer.json").unlink()
    result = run(*args, check=False)
    assert result.returncode == 2 and "cannot load the tokenizer" in result.stderr


def test_repack_quantize_modes(checkpoints, tmp_path):
    """`--q-mode` as mlx_lm.convert's: each mode's own group size; a mode's other bits refused."""
    src, dst = str(checkpoints.hf("qwen3_moe")), str(tmp_path / "model")
    run("repack", src, dst, "--quantize", "4", "--q-mode", "nvfp4")
    assert "4-bit nvfp4, group 16" in run("info", dst).stdout
    refused = run(
        "repack", src, str(tmp_path / "no"), "--quantize", "8", "--q-mode", "nvfp4", check=False
    )
    assert refused.returncode == 2 and not (tmp_path / "no").exists()
    assert refused.stderr.strip().splitlines() == [
        "streamer: error: --q-mode nvfp4 quantizes to 4 bits in groups of 16: pass --quantize 4 "
        "(and no other --group-size)."
    ]


def test_no_help_says_both_unset_and_a_default():
    """`demo --help` said "--seed (unset: random) (default: 0)"."""
    from streamer.cli import DefaultsShown, parser

    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        formatter = DefaultsShown(name)
        for action in sub._actions:
            text = formatter._get_help_string(action) or ""
            assert not ("unset" in text and "(default:" in text), (name, action.dest, text)


@pytest.mark.parametrize(
    "argv, said",
    [
        (["generate", "--promt", "hi"], "unrecognized arguments: --promt (did you mean --prompt?)"),
        (["generate", "--model", "m", "--prompt=hi", "--max-token", "3", "--tmp=1"], "--tmp=1"),
        (["repack", "src", "--quantise", "4"], "unrecognized arguments: --quantise"),
        (  # a complete command line: argparse's top parser said it, naming `streamer --help`
            ["generate", "--model", "m", "--prompt", "hi", "--temperature", "1"],
            "--temperature (did you mean --temp?) (see `streamer generate --help`)",
        ),
    ],
)
def test_an_unknown_flag_is_reported_before_a_missing_one(argv, said, capsys):
    """argparse reported "--prompt is required" for `--promt hi`, hiding the typo; an
    abbreviation (--max-token) and a value such as "-" or "-5" are not unknown flags."""
    from streamer.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "required" not in err and len(err.strip().splitlines()) == 1, err
    assert main(["generate", "--model", "/nonexistent", "--prompt", "-5"]) == 2
    assert "unrecognized" not in capsys.readouterr().err


def test_a_value_beginning_with_a_dash_is_shown_how_to_pass(capsys):
    """`--memory-budget -1G` said only "argument --memory-budget: expected one argument", though
    a value was typed (argparse reads it as an option); docs/faults.md shows the `=` form."""
    from streamer.cli import main

    assert main(["generate", "--model", "m", "--prompt", "hi", "--memory-budget", "-1G"]) == 2
    err = capsys.readouterr().err
    assert "'-1G' was read as an option; write --memory-budget=-1G" in err, err
    assert main(["plan", "m", "--memory"]) == 2  # no value at all: argparse's words alone
    assert "expected one argument (see `streamer plan --help`)" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--memory-budget", "--max-kv-size"])
def test_help_gives_the_default_of_a_decided_option(flag):
    """docs/commands.md: `--help` gives each option's default; these said none (the budget is
    decided from the memory available, the KV cache unbounded)."""
    from streamer.cli import DefaultsShown, parser

    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    action = commands.choices["generate"]._option_string_actions[flag]
    assert "(default:" in DefaultsShown("generate")._get_help_string(action)


def test_chat_is_described_as_taking_a_download():
    """`streamer --help` said chat takes "a repacked model"; like generate and serve it streams an
    MLX download in place too (docs/commands.md: DIR)."""
    from streamer.cli import parser

    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    said = {a.dest: a.help for a in commands._choices_actions}
    assert "MLX download" in said["chat"] and "MLX download" in said["generate"]
    # verify refuses a download that is not MLX-quantized, as info does: "a download" said more
    assert "MLX download" in said["verify"] and "MLX download" in said["info"]
    for name in ("verify", "info"):
        folder = commands.choices[name]._actions[1]
        assert "MLX download" in folder.help, (name, folder.help)


def test_verify_refuses_the_flags_of_the_other_kind_of_folder(checkpoints):
    """`--record`/`--checksums` on a repacked folder and `--refresh` on a download did nothing:
    with --record not even the closing line said so, as if a sidecar had been written."""
    download = str(checkpoints.mlx("qwen3_moe"))
    for args, said in (
        ([_model(checkpoints), "--record"], "--record and --checksums are a download's"),
        ([_model(checkpoints), "--checksums", "sums.json"], "is a repacked folder"),
        ([download, "--refresh"], "--refresh records a repacked folder's file times"),
    ):
        result = run("verify", *args, check=False)
        assert result.returncode == 2, result.stderr
        assert said in result.stderr.strip().splitlines()[-1]


def test_a_closed_stderr(checkpoints, tmp_path):
    """Started with stderr closed (`2>&-`, a daemon's closed descriptors), Python's sys.stderr is
    None: repack's log lines went to stdout, then its progress bar raised (exit 1, unseen)."""
    import os

    dst = tmp_path / "model"
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "repack", str(checkpoints.hf("qwen3_moe")), str(dst)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.close(2),
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout == ""
    assert (dst / "manifest.json").is_file()


def test_closed_standard_descriptors_are_held_by_dev_null():
    """With stdin and stderr closed, the first file the command opened took number 0, the next
    number 2, where a write to stderr (Ctrl-C's line, a native library's) would land in it."""
    import os

    script = (
        "import os; from streamer.cli.output import set_up_output; set_up_output(); "
        "print(os.open(os.devnull, os.O_RDONLY), os.readlink('/proc/self/fd/2'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        preexec_fn=lambda: (os.close(0), os.close(2)),
        timeout=60,
    )
    number, stderr = result.stdout.split()
    assert int(number) > 2 and stderr == os.devnull


def test_a_size_typed_as_two_words_is_shown_as_one(capsys):
    """`--memory-budget 8 GB` (as sizes are written in prose) said "unrecognized arguments: GB"."""
    from streamer.cli import main

    assert main(["generate", "--model", "m", "-p", "hi", "--memory-budget", "8", "GB"]) == 2
    err = capsys.readouterr().err
    assert "write the size as one word: --memory-budget 8GB" in err and len(err.splitlines()) == 1
