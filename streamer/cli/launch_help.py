"""`streamer launch --help`: streamer's usage (what launch does, the `--` before the command),
then mlx.launch's options, which it parses and describes itself."""

from __future__ import annotations

USAGE = """\
usage: streamer launch [mlx.launch's options] -- COMMAND [COMMAND's options]

Run one streamer command (generate, chat, serve, ...) in every rank of an expert-parallel group,
through MLX's launcher: everything before `--` is mlx.launch's, everything after it is the
command each rank runs, as `streamer COMMAND ...` would. Exits with the first failing rank's
status, after one line saying why (mlx.launch itself exits 0 whatever its ranks exit with).

examples:
  streamer launch --hosts mac0,mac1 -- generate --model ~/qwen-shard --prompt "..."
  streamer launch -n 2 -- serve --model ~/qwen-shard-{rank}

docs/distributed.md tells how to split a model for the group (streamer split). mlx.launch's
options follow, as mlx.launch says them:
"""


def say_usage_if_asked(words: list[str]) -> None:
    """Print USAGE where the launcher's own words (those before `--`) ask for help; mlx.launch's
    parser then prints its options and exits."""
    own = words[: words.index("--")] if "--" in words else words
    if any(w in ("-h", "--help") for w in own):
        print(USAGE)
