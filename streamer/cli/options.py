"""Options several commands share (the prompt is read by prompt_text.py)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..arguments import (
    DTYPE_NAMES,
    MIN_KV_SIZE,
    NO_LIMIT,
    check_at_least,
    check_sampling,
)
from ..defaults import PREFILL_STEP
from ..errors import StreamerError
from ..io.sizes import parse_size

if TYPE_CHECKING:  # mlx is imported only once a command runs
    import mlx.core as mx

    from ..loading.options import LoadOptions


def option_group(p: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """`p`'s options titled `title` in its --help, the group made on first use: a command of 30
    options lists them by what they set."""
    made = [group for group in p._action_groups if group.title == title]
    return made[0] if made else p.add_argument_group(title)


def size(text: str) -> int:
    """argparse type for a size such as 8G, read as the Python API reads one (parse_size)."""
    try:
        return parse_size(text, "")
    except StreamerError as e:  # its words, argparse naming the option
        raise argparse.ArgumentTypeError(str(e).strip().rstrip(".")) from None


def add_quantize(p: argparse.ArgumentParser, what: str) -> None:
    """`--quantize BITS [--group-size N] [--q-mode M]`, as mlx_lm.convert's."""
    p.add_argument("--quantize", type=int, choices=(2, 3, 4, 5, 6, 8), help=what)
    p.add_argument(
        "--group-size",
        "--q-group-size",  # mlx_lm.convert's spelling
        type=int,
        choices=(16, 32, 64, 128),
        help="quantization group size (default: 64 affine; the mode's own otherwise)",
    )
    p.add_argument(
        "--q-mode",
        default="affine",
        choices=("affine", "nvfp4", "mxfp4", "mxfp8"),
        help="quantization mode, as mlx_lm.convert --q-mode (nvfp4 and mxfp4: 4 bits, mxfp8: 8)",
    )


def quantize_option(args: argparse.Namespace):
    """The `Quantize` the --quantize flags ask for (None without --quantize)."""
    from ..families.config.common_fields import MODE_DEFAULTS
    from ..repack.recipe import Quantize

    if not args.quantize:
        if args.q_mode != "affine" or args.group_size:
            raise StreamerError(
                "--q-mode and --group-size choose how --quantize quantizes: pass it."
            )
        return None
    group_size = args.group_size or MODE_DEFAULTS[args.q_mode][0]
    return Quantize(args.quantize, group_size, args.q_mode)


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="a folder written by `streamer repack` or `streamer split`, an MLX download (streamed "
        "in place), or org/name (pulled, or the hub cache); under mlx.launch, {rank} in it is "
        "replaced by the rank",
    )


def model_folder(args: argparse.Namespace, group: mx.distributed.Group | None) -> str:
    """The folder --model names for this rank: under mlx.launch "{rank}" is the rank's number (a
    folder per shard); org/name is a pulled model or is looked up in the hub cache. A name not
    downloaded is offered to `streamer pull` when a person is at the terminal to say yes."""
    from ..loading.hub import NotDownloaded, streamable

    name = args.model.replace("{rank}", str(group.rank() if group else 0))
    try:
        return streamable(name)
    except NotDownloaded as e:
        if group is not None or not (sys.stdin.isatty() and sys.stderr.isatty()):
            raise
        print(f"[streamer] {e}", file=sys.stderr)
        print(f"Pull {e.name} now (`streamer pull {e.name}`)? [y/N] ", end="", file=sys.stderr)
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            raise
    from ..pull import pull

    pull(name)
    return streamable(name)


def add_sampling(p: argparse.ArgumentParser, seed: int | None = None) -> None:
    p = option_group(p, "sampling")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample from the likeliest top-p")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top")
    unset = " (unset: random)" if seed is None else ""  # else help shows the default
    p.add_argument("--seed", type=int, default=seed, help=f"the sampler's seed{unset}")


def add_prompt(
    p: argparse.ArgumentParser, prompt_default: str | None, seed: int | None = None
) -> None:
    p.add_argument(  # -p and -m: mlx_lm.generate's short forms
        "--prompt",
        "-p",
        default=prompt_default,
        required=prompt_default is None,
        help="text to continue (\\n, \\t: a newline, a tab; '-': read stdin)",
    )
    p.add_argument(
        "--max-tokens",
        "-m",
        type=int,
        default=100,
        help="tokens to generate at most (-1: until the context is full)",
    )
    add_sampling(p, seed)


def add_template(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system-prompt", default=None, help="a system message before the prompt")
    p.add_argument(
        "--ignore-chat-template",
        action="store_true",
        help="use the prompt as plain text even if the model has a chat template",
    )
    p.add_argument(
        "--chat-template-config",
        metavar="JSON",
        help="the chat template's variables, as mlx_lm.generate's: e.g. "
        "'{\"enable_thinking\": false}' (Qwen3: no thinking)",
    )


def add_loading(p: argparse.ArgumentParser) -> None:
    p = option_group(p, "loading")
    p.add_argument(
        "--memory-budget",
        type=size,
        default=None,
        metavar="SIZE",
        help="bytes of experts to keep resident, e.g. 4G (default: all of them if they fit in "
        "half the available memory, else 0; on the slot path 75%%, else that much as its pool)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        help="what to compute in (default: float32 on the CPU, the checkpoint's own on a GPU); "
        "mlx-lm computes an MLX-quantized download in its scales' dtype, bfloat16 as a rule: "
        "pass that to get mlx-lm's exact text",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a tokenizer that ships Python code (Kimi K2)",
    )
    p.add_argument(
        "--read-path",
        choices=["slots", "mapped"],
        help="slots: a bounded slot pool filled by reads (default on Metal and CUDA); mapped: "
        "compute in place on the mapped files (default on the CPU)",
    )
    p.add_argument(
        "--verify-reads",
        action="store_true",
        help="check each expert's crc32 whenever it is read from the disk",
    )
    p.add_argument(
        "-t",
        "--threads",
        type=int,
        metavar="N",
        help="CPU backend: the cores a token's large matmuls are cut across (default: every "
        "core this process may use, shared by the ranks a launch runs on this machine; 1: one, "
        "as mlx-lm computes); a GPU computes them itself",
    )
    p.add_argument(
        "--checksums",
        metavar="FILE",
        help="an MLX download's checksum sidecar, if not the default (see `streamer verify`)",
    )


def load_options(args: argparse.Namespace, group: mx.distributed.Group | None) -> LoadOptions:
    """streamer.load's options as add_loading's flags set them, decided by the function the API's
    keywords go through (loading/options.py), before the model folder is looked up."""
    from ..loading.options import load_options as decided

    return decided(
        memory_budget=args.memory_budget,
        dtype=args.dtype,
        read_path=args.read_path,
        verify_reads=args.verify_reads,
        trust_remote_code=args.trust_remote_code,
        checksums=args.checksums,
        threads=args.threads,
        group=group,
        option="--",
    )


def add_prefill_step_size(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prefill-step-size",
        type=int,
        default=PREFILL_STEP,
        metavar="N",
        help="prompt tokens computed at a time (fewer: a lower peak while a long prompt prefills)",
    )


def prefill_option(args: argparse.Namespace) -> dict:
    """streamer.generate's prefill_step_size for --prefill-step-size, checked before the load."""
    check_at_least(args.prefill_step_size, "--prefill-step-size", 1)
    return {"prefill_step_size": args.prefill_step_size}


def check_sampling_flags(args: argparse.Namespace, no_limit: bool = False) -> None:
    """The sampling flags and --max-tokens (and --max-kv-size where the command has it), checked
    before the slow imports and the load; `no_limit`: --max-tokens may be -1, mlx-lm's "no limit"
    (generate's: until the context is full)."""
    check_sampling(
        args.temp,
        args.top_p,
        getattr(args, "seed", None),
        top_k=args.top_k,
        min_p=args.min_p,
        option="--",
        dash=True,
    )
    if not (no_limit and args.max_tokens == NO_LIMIT):
        check_at_least(args.max_tokens, "--max-tokens", 1)
    if getattr(args, "max_kv_size", None) is not None:
        check_at_least(args.max_kv_size, "--max-kv-size", MIN_KV_SIZE)
