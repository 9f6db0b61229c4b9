"""Commands that need no model start without importing mlx-lm (seconds: transformers comes with it);
how long they take is measured in bench/startup.py."""

from __future__ import annotations

import subprocess
import sys

import streamer


def imports_of(code: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split("\n")[-2].split())


def test_help_version_info_and_plan_of_a_repacked_folder_do_not_import_mlx_lm(checkpoints):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    run = "from streamer.cli import main\ntry:\n    main({})\nexcept SystemExit:\n    pass"
    for argv in (["--help"], ["--version"], ["info", str(folder)], ["plan", str(folder)]):
        modules = imports_of(run.format(argv))
        assert "mlx_lm" not in modules and "transformers" not in modules, argv
    version = subprocess.run(
        [sys.executable, "-m", "streamer", "--version"], capture_output=True, text=True
    )
    assert version.stdout.strip() == f"streamer {streamer.__version__}"


def test_plan_quantize_of_a_download_does_not_import_transformers(checkpoints):
    """`plan --quantize` quantizes as mlx_lm.utils.quantize_model without importing mlx_lm.utils
    (and transformers, torch with it: seconds, its largest cost)."""
    hf = str(checkpoints.hf("qwen3_moe"))
    run = "from streamer.cli import main\nassert main({}) == 0"
    modules = imports_of(run.format(["plan", hf, "--quantize", "4"]))
    assert "transformers" not in modules and "mlx_lm.utils" not in modules


def test_generate_and_chat_refused_before_the_tokenizer_do_not_import_transformers(tmp_path):
    """A missing model is refused at once: transformers (seconds) comes with the tokenizer only.
    Both commands in one process: neither may import it."""
    missing = str(tmp_path / "missing")
    commands = [["generate", "--model", missing, "--prompt", "x"], ["chat", "--model", missing]]
    run = "from streamer.cli import main\nassert [main(a) for a in {}] == [2, 2]"
    modules = imports_of(run.format(commands))
    assert "transformers" not in modules and "mlx_lm.tokenizer_utils" not in modules
