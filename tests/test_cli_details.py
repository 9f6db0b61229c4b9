"""What a user notices at the command line: sizes in a unit that fits, defaults in the help,
options that contradict or name nothing refused in one line, progress on a terminal."""

from __future__ import annotations

import re

import pytest
from test_progress import on_a_terminal

from streamer.cli import main
from streamer.io.sizes import size_text


def test_sizes_take_a_unit_that_fits():
    assert [size_text(n) for n in (0, 512, 1536, 3 << 20, 5.5 * (1 << 30))] == [
        "0 B",
        "512 B",
        "1.50 KiB",
        "3.00 MiB",
        "5.50 GiB",
    ]


def test_rates_are_in_the_sizes_units(checkpoints, tmp_path):
    """repack and verify printed rates in decimal MB/s beside sizes in MiB."""
    from streamer.repack import repack
    from streamer.verify import verify

    lines: list[str] = []
    dst = tmp_path / "repacked"
    repack(checkpoints.hf("qwen3_moe"), dst, log=lines.append)
    verify(dst, log=lines.append)
    download = checkpoints.mlx("qwen3_moe")
    verify(download, record=True, checksums=tmp_path / "sums.json", log=lines.append)
    rates = [line for line in lines if "/s)" in line]
    assert len(rates) >= 3 and all(re.search(r"[KMGT]iB/s\)", line) for line in rates), lines
    assert not any("MB/s" in line for line in lines), lines


def test_info_and_plan_print_no_zero_gigabytes(checkpoints, capsys):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    for argv in (["info", str(folder)], ["plan", str(folder)]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert not re.search(r"(?<![\d.])0\.00 ", out) and " GB" not in out and "MiB" in out, out


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 8080)", "(default: 512)", "(default: 10)", "(default: 64)"):
        assert default in text
    assert "(default: None)" not in text and "(default: False)" not in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--chat", "--ignore-chat-template"], "--chat asks for the chat template"),
        (["--checksums", "/nonexistent/sums.json"], "--checksums /nonexistent/sums.json: no such"),
        (["--extra-eos-token", "99999"], "--extra-eos-token: token id 99999 is not one of the"),
        (["--extra-eos-token", "-1"], "--extra-eos-token: token id -1 is not one of the"),
        (["--kv-bits", "4", "--quantized-kv-start", "-1"], "--quantized-kv-start must be at least"),
    ],
)
def test_contradictions_and_missing_files_are_refused(checkpoints, capsys, flags, message):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    argv = ["generate", "--model", str(folder), "--prompt", "hi", "--max-tokens", "2", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err  # (after the residency line, for a refusal after the load)
    line = err.splitlines()[-1]
    assert line.startswith("streamer: error: ") and message in line and "Traceback" not in err


@pytest.mark.parametrize("drafting", [[], ["--prompt-lookup"]])
def test_a_terminal_sees_the_load_and_a_long_prefill(checkpoints, drafting):
    """With drafts too: the speculative loop reports its prefill as mlx-lm's does, and generate
    and chat decided it had no callback, so a drafted answer's long prefill showed no bar."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    prompt = "import os\n" * 100  # 700 tokens: over 512
    text = on_a_terminal(
        "generate",
        "--model",
        str(folder),
        "--prompt",
        prompt,
        "--max-tokens",
        "1",
        "--ignore-chat-template",
        *drafting,
    )
    assert "[streamer] non-expert weights:" in text and "prefill:" in text


@pytest.mark.parametrize("what", ["file", "folder", "empty folder"])
@pytest.mark.parametrize("command", ["generate", "info", "verify"])
def test_a_path_that_holds_no_model_says_what_it_is(tmp_path, capsys, what, command):
    """It said `Run streamer repack SRC README.md first`."""
    path = tmp_path / ("README.md" if what == "file" else "docs")
    if what == "file":
        path.write_text("# a model\n")
    else:
        path.mkdir()
        if what == "folder":
            (path / "index.md").write_text("docs\n")
    argv = [command, str(path)] if command != "generate" else [command, "--model", str(path)]
    assert main([*argv, "--prompt", "hi"] if command == "generate" else argv) == 2
    line = capsys.readouterr().err.strip()
    kind = {"file": "a file, not a model's folder", "folder": "a folder without a model"}
    kind["empty folder"] = "an empty folder"
    assert f"{path} is {kind[what]}" in line, line
    assert "manifest.json" in line and "config.json" in line and "repack SRC" not in line, line


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_mlx_lm_s_short_flags_are_taken(command):
    """mlx_lm.generate's `-p PROMPT` and `-m N` (mlx_lm.chat's `-m`): refused as unrecognized
    arguments, where a user of mlx-lm types them."""
    from streamer.cli import parser

    words = [command, "--model", "m", "-m", "7"] + (["-p", "hi"] if command == "generate" else [])
    args = parser().parse_args(words)
    assert args.max_tokens == 7 and getattr(args, "prompt", "hi") == "hi"


def test_generate_takes_mlx_lm_s_no_limit(checkpoints, capsys):
    """`--max-tokens -1`, mlx_lm.generate's "no limit" and the Python API's, was refused ("must be
    at least 1"); it generates until the model's context (2048 here) is full."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    prompt = "import os\n" * 292  # 2044 tokens: 4 left
    argv = ["generate", "--model", str(folder), "-p", prompt, "--ignore-chat-template"]
    assert main([*argv, "-m", "-1"]) == 0
    decoded = int(re.search(r"decode: (\d+) tokens", capsys.readouterr().err)[1])
    assert 0 < decoded <= 4
    assert main([*argv, "-m", "-2"]) == 2
    assert "--max-tokens must be at least 1 (got -2)" in capsys.readouterr().err


def test_a_prompt_s_backslash_n_and_t_are_mlx_lm_s_newline_and_tab(checkpoints, capsys):
    """mlx_lm.generate reads `\\n` and `\\t` typed in --prompt as a newline and a tab; streamer
    read them as backslashes, so the same command line computed another prompt than mlx-lm's."""
    import streamer

    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    model, tokenizer = streamer.load(folder)
    argv = ["generate", "--model", str(folder), "-m", "4", "--ignore-chat-template"]
    assert main([*argv, "-p", "import os\\n\\timport sys"]) == 0
    out = capsys.readouterr().out
    assert out == streamer.generate(model, tokenizer, "import os\n\timport sys", 4) + "\n"


def test_verbose_false_prints_the_answer_alone(checkpoints, capsys):
    """mlx_lm.generate's `--verbose False` (only the response) was an unrecognized argument; it
    leaves out the residency and stats lines, and `--verbose True` is the default."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    argv = ["generate", "--model", str(folder), "-p", "import os", "-m", "4"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "[streamer] all experts resident" in err and "decode: 4 tokens" in err
    for quiet in ("False", "f"):
        assert main([*argv, "--verbose", quiet]) == 0
        assert capsys.readouterr() == (out, "")
    assert main([*argv, "--verbose", "True"]) == 0
    assert capsys.readouterr().out == out


@pytest.mark.parametrize(
    "flag", [["--system-prompt", "Be brief."], ["--chat-template-config", "{}"]]
)
def test_template_flags_without_a_template_are_refused(checkpoints, tmp_path, capsys, flag):
    """generate dropped --system-prompt (and the template's variables) without a word where no
    template is applied: with --ignore-chat-template, or for a model that has none."""
    import json
    import shutil

    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    plain = tmp_path / "no-template"
    shutil.copytree(folder, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    argv = ["generate", "-p", "hi", "-m", "2", *flag]
    assert main([*argv, "--model", str(folder), "--ignore-chat-template"]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line == (
        f"streamer: error: {flag[0]} goes into the chat template, which --ignore-chat-template "
        "leaves out: drop one of them."
    )
    assert main([*argv, "--model", str(plain)]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line == (
        f"streamer: error: {flag[0]}: {plain} has no chat template to put it in "
        "(tokenizer_config.json has no chat_template): leave it out."
    )


def test_generate_takes_mlx_lm_s_prefill_step_size(checkpoints, capsys):
    """mlx_lm.generate's `--prefill-step-size N` (the prompt computed N tokens at a time: a lower
    peak while it prefills) was an unrecognized argument."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    prompt = "import os\n" * 100  # 700 tokens
    argv = ["generate", "--model", str(folder), "-p", prompt, "-m", "1", "--ignore-chat-template"]

    def peak(*flags: str) -> tuple[str, float]:
        assert main([*argv, *flags]) == 0
        out, err = capsys.readouterr()
        return out, float(re.search(r"MLX peak ([\d.]+) MiB", err)[1])

    whole, chunked = peak(), peak("--prefill-step-size", "64")
    # MLX's peak is the process's: models of earlier tests still held count in both alike
    assert whole[0] == chunked[0] and chunked[1] < whole[1] - 2, (whole, chunked)  # 7.4 vs 3.3
    assert main([*argv, "--prefill-step-size", "0"]) == 2
    assert "--prefill-step-size must be at least 1 (got 0)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "-p", "hi", "--adapter-path", "a"], "--adapter-path is mlx-lm's: streamer"),
        (["chat", "--adapter-path", "a"], "fuse them into the model first (mlx_lm.fuse)"),
        (["generate", "-p", "hi", "--xtc-probability", "0.5"], "the Python API takes it"),
        (["serve", "--decode-concurrency", "4"], "one sequence at a time"),
        (["generate", "-p", "hi", "--prompt-cache-file", "f"], "--prompt-cache-dir"),
    ],
)
def test_mlx_lm_s_flags_streamer_lacks_say_why(capsys, argv, message):
    """mlx-lm's flags that streamer does not take said only "unrecognized arguments"."""
    assert main([argv[0], "--model", "m", *argv[1:]]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("streamer: error: ") and message in line and "\n" not in line, line


def test_info_s_resident_bytes_are_said_to_be_as_stored(checkpoints, capsys):
    """info gave the non-expert weights' bytes as stored (bfloat16 here) as "kept in memory",
    beside plan's, in the compute dtype (float32 on the CPU): two sizes for one thing."""
    from mlx.utils import tree_flatten

    import streamer
    from streamer.io.sizes import size_text

    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    model, _ = streamer.load(folder)
    weights = tree_flatten(model.parameters())
    in_memory = sum(v.nbytes for k, v in weights if "switch_mlp" not in k)
    assert main(["info", str(folder)]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("resident")]
    assert size_text(in_memory) not in line  # bfloat16 on disk, float32 computed
    assert "in memory" not in line and "as stored" in line, line
    assert main(["plan", str(folder)]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("resident")]
    assert size_text(in_memory) in line and "in memory" in line, line


def test_info_does_not_say_experts_are_streamed_where_the_default_keeps_them(checkpoints, capsys):
    """info said "expert bytes ... (streamed from disk)" of a model whose experts the default
    budget keeps resident every one (plan says so): where they live is the budget's choice."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    assert main(["plan", str(folder)]) == 0
    plan = capsys.readouterr().out
    assert "residency (mapped) all experts resident" in plan, plan
    assert main(["info", str(folder)]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("expert bytes")]
    assert "streamed from disk)" not in line and "--memory-budget" in line, line
    assert "`streamer plan`" in line, line


def test_info_names_the_quantization_of_every_module_the_config_names(checkpoints, capsys):
    """gpt-oss's download repacked with --quantize 4 keeps its MXFP4 experts and quantizes its
    other layers as mlx_lm.convert does (affine 4-bit, its router 8-bit), named per module under
    an MXFP4 default: info said "quantization 4-bit mxfp4, group 32", which no layer but the
    experts is (gpt-oss-120b's 1.2 GiB of resident weights are affine)."""
    from streamer.repack import Quantize

    folder = checkpoints.repacked(checkpoints.hf("gpt_oss"), quantize=Quantize(4))
    assert main(["info", str(folder)]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("quantization")]
    assert line.endswith(
        "4-bit mxfp4, group 32; by module: 4-bit affine, group 64 (10), 8-bit affine, group 64 (2)"
    ), line


def test_info_of_a_download_to_repack_points_at_plan(checkpoints, capsys):
    """`streamer info` of a bf16 download (its help: "a download") said only to repack it: plan is
    what describes such a download, and what its repack will hold."""
    download = str(checkpoints.hf("qwen3_moe"))
    assert main(["info", download]) == 2
    line = capsys.readouterr().err.strip()
    assert f"`streamer plan {download}`" in line and f"streamer repack {download} DST" in line
    assert "\n" not in line, line


def test_a_port_in_use_is_said_before_the_model_loads(capsys):
    """`serve --port P` with P taken loaded the model (minutes for a large one), then said only
    "cannot listen on 127.0.0.1:P: Address already in use"."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--model", "/nonexistent", "--port", str(port)]) == 2
    line = capsys.readouterr().err.strip()
    assert f"cannot listen on 127.0.0.1:{port}" in line and "another --port" in line, line
    assert "\n" not in line, line


@pytest.mark.parametrize("typed", ["16", "512"])
@pytest.mark.parametrize(
    "command, option",
    [
        (["plan", "/nonexistent"], "--memory"),
        (["generate", "--model", "/nonexistent", "-p", "hi"], "--memory-budget"),
        (["serve", "--model", "/nonexistent"], "--prompt-cache-bytes"),
        (["serve", "--model", "/nonexistent"], "--prompt-cache-disk"),
    ],
)
def test_a_size_without_a_unit_is_not_taken_as_bytes(command, option, typed, capsys):
    """`plan --memory 16` (16 GB meant) planned for 16 bytes: "runs no ... in 16 B", a slot pool
    of 1 slot in "75% of 0 B available"; `--memory-budget 8` loaded the model to say "8 B is below
    the minimum", with no word of the unit."""
    assert main([*command, option, typed]) == 2
    line = capsys.readouterr().err.strip()
    assert f"{option}: '{typed}' has no unit, so it counts bytes: write {typed}G" in line, line


def test_a_size_of_0_without_a_unit_is_taken():
    """--memory-budget 0 streams every expert: 0 needs no unit."""
    from streamer.cli import parser

    argv = ["generate", "--model", "m", "-p", "hi", "--memory-budget", "0"]
    assert parser().parse_args(argv).memory_budget == 0


def test_the_apis_defaults_are_the_clis():
    """A default written out in a signature and again as its flag's (serve's and chat's
    max_tokens, the Engine's prompt_cache_size, the speculative loop's prefill step) could drift
    apart unseen: each is named once in streamer/defaults.py, and each pair agrees."""
    import argparse
    import inspect

    from streamer import defaults
    from streamer.cli import parser
    from streamer.cli.chat import chat
    from streamer.server import serve
    from streamer.server.engine import Engine
    from streamer.speculative.loop import speculative_generate_step

    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))

    def flag(command: str, dest: str):
        return commands.choices[command].get_default(dest)

    def keyword(function, name: str):
        return inspect.signature(function).parameters[name].default

    pairs = [
        (keyword(serve, "max_tokens"), flag("serve", "max_tokens"), defaults.MAX_TOKENS),
        (keyword(chat, "max_tokens"), flag("chat", "max_tokens"), defaults.MAX_TOKENS),
        (
            keyword(Engine.__init__, "prompt_cache_size"),
            flag("serve", "prompt_cache_size"),
            defaults.PROMPT_CACHE_SIZE,
        ),
        (
            keyword(speculative_generate_step, "prefill_step_size"),
            flag("generate", "prefill_step_size"),
            defaults.PREFILL_STEP,
        ),
    ]
    assert all(api == cli == named for api, cli, named in pairs), pairs
