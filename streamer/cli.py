"""`streamer` command line: repack, split, generate, verify, info, demo."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from . import __version__
from .arguments import check_sampling, parse_size
from .errors import StreamerError


def _repack(args: argparse.Namespace) -> None:
    _import_exiting_on_ctrl_c("streamer.repack")
    from .hub import resolve
    from .repack import Quantize, repack

    quantize = Quantize(args.quantize, args.group_size) if args.quantize else None
    src = resolve(args.src, "source")
    if args.delete_source and src != Path(args.src):
        raise StreamerError(
            f"--delete-source: {args.src} lives in the Hugging Face cache, whose files are shared "
            "links: repack without it, then remove the download with `hf cache` (see its --help)."
        )
    repack(
        src,
        args.dst,
        quantize=quantize,
        force=args.force,
        resume=args.resume,
        delete_source=args.delete_source,
    )


def _split(args: argparse.Namespace) -> None:
    from .repack.split import split
    from .shards import parse_shard

    rank, ranks = parse_shard(args.shard)
    split(args.src, args.dst, rank, ranks, trace=args.trace, force=args.force)


def _verify(args: argparse.Namespace) -> int:
    from .download import is_download
    from .verify import verify

    problems = verify(args.dir, refresh=args.refresh, record=args.record, checksums=args.checksums)
    for problem in problems:
        print(f"streamer: bad: {problem}", file=sys.stderr)
    if problems:
        remedy = (
            "download the named files again, then record their checksums again with --record."
            if is_download(args.dir)
            else "repack the model from its source."
        )
        print(
            f"streamer: {len(problems)} problem(s) in {args.dir}: {remedy}",
            file=sys.stderr,
        )
        return 1
    if not args.record:
        print(f"[verify] {args.dir}: every checksum matches", file=sys.stderr)
    return 0


def _prompt(args: argparse.Namespace) -> str:
    """The prompt as UTF-8 text, from --prompt or (with `--prompt -`) from stdin's bytes.

    Arguments reach Python as text decoded with surrogate escapes; os.fsencode recovers the bytes
    the shell passed, so invalid UTF-8 is reported here instead of failing inside the tokenizer.
    An empty prompt or a --max-tokens below 1 is refused before the model is loaded.
    """
    from .generate import check_request

    raw = sys.stdin.buffer.read() if args.prompt == "-" else os.fsencode(args.prompt)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StreamerError(
            f"the prompt is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}): "
            "pass UTF-8 text (check the file's or terminal's encoding)."
        ) from None
    check_sampling(args.temp, args.top_p, args.seed, option="--", dash=True)
    how = " with --prompt (or `--prompt -` for stdin)"
    check_request(text, args.max_tokens, option="--max-tokens", how=how)
    return text


def _generate(args: argparse.Namespace) -> int:
    if args.model is None:
        raise StreamerError(
            "no --model given. Repack a downloaded MoE checkpoint with `streamer repack SRC DST` "
            "and pass --model DST, or run `streamer demo` to see the whole pipeline on a built-in "
            "model."
        )
    prompt = _prompt(args)  # before the slow imports: bad input fails fast
    _import_exiting_on_ctrl_c("streamer.model", "streamer.generate")
    from .chat import templated
    from .distributed import launched_group, shared_seed
    from .hub import streamable
    from .model import load

    group = args.group = launched_group()  # started by mlx.launch: expert-parallel
    rank = group.rank() if group else 0
    model, tokenizer = load(
        streamable(args.model.replace("{rank}", str(rank))),  # {rank}: a folder per rank
        memory_budget=args.memory_budget,
        read_path=args.read_path,
        verify_reads=args.verify_reads,
        trust_remote_code=args.trust_remote_code,
        group=group,
        checksums=args.checksums,
    )
    if group is not None:
        args.seed = shared_seed(group, args.seed)  # sampled tokens must agree on every rank
    if rank == 0:
        print(f"[streamer] {model.streamer.residency}", file=sys.stderr)
    if group is not None and rank == 0:
        print(
            f"[streamer] expert-parallel over {group.size()} ranks: each computes its share of "
            "every MoE layer's routed experts",
            file=sys.stderr,
        )
    for token in args.extra_eos_token:
        try:
            tokenizer.add_eos_token(token)
        except ValueError as e:
            raise StreamerError(f"--extra-eos-token: {e}") from None
    if args.chat and not tokenizer.has_chat_template:
        raise StreamerError(
            f"--chat: {args.model} has no chat template (tokenizer_config.json has no "
            "chat_template): drop --chat to continue the prompt as plain text."
        )
    if tokenizer.has_chat_template and not args.ignore_chat_template:
        try:
            prompt = templated(tokenizer, prompt, args.system_prompt)
        except Exception as e:  # jinja2's errors, or whatever the template raises
            raise StreamerError(
                f"{args.model}: the model's chat template fails ({type(e).__name__}: {e}); fix "
                "chat_template in tokenizer_config.json (or chat_template.jinja), or pass "
                "--ignore-chat-template."
            ) from e
    return _stream(model, tokenizer, prompt, args)


def _stream(model, tokenizer, prompt: str, args: argparse.Namespace) -> int:
    from mlx_lm.sample_utils import make_sampler

    from .generate import run_stats, stream_generate

    group = getattr(args, "group", None)
    shown = group is None or group.rank() == 0  # rank 0 prints for the group
    sampler = make_sampler(args.temp, top_p=args.top_p, min_p=args.min_p, top_k=args.top_k)
    stats = None
    try:
        for response in stream_generate(
            model,
            tokenizer,
            prompt,
            args.max_tokens,
            seed=args.seed,
            sampler=sampler,
            max_kv_size=getattr(args, "max_kv_size", None),
        ):
            if shown:
                _emit(response.text, end="")
            stats = response.stats
    except KeyboardInterrupt:
        if shown:
            print("\n[interrupted]", file=sys.stderr)
            print((stats or run_stats(model)).line(), file=sys.stderr)
        return 130
    line = stats.line() if stats is not None else None
    if group is not None and stats is not None:
        from .distributed import group_stats_line

        line = f"{line} | {group_stats_line(group, model, stats)}"  # every rank takes part
    if shown:
        _emit()
        if line is not None:
            print(line, file=sys.stderr)
    return 0


def _serve(args: argparse.Namespace) -> None:
    from .distributed import GroupError, launched_group

    args.group = launched_group()
    if args.group is not None:  # rank 0 would wait forever in its first layer's all_sum
        raise GroupError(
            "streamer serve does not run expert-parallel yet: under mlx.launch only `streamer "
            "generate` does. Serve a full repacked folder from one machine."
        )
    _import_exiting_on_ctrl_c("streamer.server")
    from .hub import streamable
    from .server import serve
    from .server.api import Sampling

    defaults = Sampling(temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p)
    serve(
        args.model,
        streamable(args.model),
        host=args.host,
        port=args.port,
        defaults=defaults,
        max_tokens=args.max_tokens,
        memory_budget=args.memory_budget,
        trust_remote_code=args.trust_remote_code,
        prompt_cache_size=args.prompt_cache_size,
    )


def _chat(args: argparse.Namespace) -> None:
    from .chat import chat
    from .hub import streamable
    from .server import open_model
    from .server.api import Sampling
    from .server.engine import Engine

    model, tokenizer, context = open_model(
        streamable(args.model), args.memory_budget, args.trust_remote_code
    )
    template = tokenizer.has_chat_template and not args.ignore_chat_template
    if not tokenizer.has_chat_template:
        print(
            "[chat] the model has no chat template: the conversation is plain text", file=sys.stderr
        )
    sampling = Sampling(
        temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, seed=args.seed
    )
    engine = Engine(model, tokenizer, prompt_cache_size=2)
    try:
        chat(
            engine,
            system_prompt=args.system_prompt,
            template=template,
            max_tokens=args.max_tokens,
            context=context,
            sampling=sampling,
        )
    finally:
        engine.close()


def _plan(args: argparse.Namespace) -> None:
    from .hub import resolve
    from .model import default_dtype
    from .plan import plan

    if args.memory is None:
        import psutil

        memory = psutil.virtual_memory().available
    else:
        memory = args.memory
    quantize = (args.quantize, args.group_size) if args.quantize else None
    result = plan(resolve(args.source, "model"), memory, quantize=quantize, dtype=default_dtype())
    print(result.json() if args.json else "\n".join(result.lines()))


def _info(args: argparse.Namespace) -> None:
    from .io.integrity import check_files
    from .io.manifest import MANIFEST_FILE, RESIDENT_FILE, read_manifest

    folder = Path(args.dir)
    if not (folder / MANIFEST_FILE).exists() and (folder / "config.json").exists():
        from .download import open_download  # builds mlx-lm's model: only for a download

        # streamed in place: an expert is one range per stacked tensor
        manifest = open_download(folder)[0]
        resident = sum(manifest.file_bytes.values()) - manifest.expert_file_bytes
        per_expert = [layer.payload_bytes for layer in manifest.layers]
        layout = f"in place, {len(manifest.layers[0].tensors)} byte ranges per expert"
    else:
        manifest = read_manifest(folder)
        check_files(folder, manifest)  # a missing, truncated or special data file is named
        resident = (folder / RESIDENT_FILE).stat().st_size
        per_expert = [layer.record_bytes for layer in manifest.layers]
        layout = "repacked, one record per expert"
    try:
        lines = _describe(manifest, layout, resident, per_expert)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise StreamerError(
            f"{folder / MANIFEST_FILE}: the model config in it is damaged ({type(e).__name__}: "
            f"{e}); repack the model."
        ) from e
    for line in lines:
        _emit(line)


def _describe(manifest, layout: str, resident: int, per_expert: list[int]) -> list[str]:
    config = manifest.config
    layers = manifest.layers
    top_k = int(config.get("num_experts_per_tok", 0))
    active = sum(per_expert) * top_k
    quant = config.get("quantization")
    expert_quant = {
        _describe_quantization(q) if q else "unquantized"
        for layer in layers
        for q in layer.quantization.values()
    }
    return [
        f"layout            {layout}",
        f"model_type        {config.get('model_type')}",
        f"layers            {config.get('num_hidden_layers')} ({len(layers)} MoE)",
        f"experts           {layers[0].num_experts} per layer, {top_k} routed per token",
        *_shard_lines(manifest),
        f"quantization      {_describe_quantization(quant) if quant else 'none'}",
        f"expert weights    {', '.join(sorted(expert_quant))}",
        f"resident bytes    {resident / 1e9:.3f} GB (non-expert weights, kept in memory)",
        f"expert bytes      {manifest.expert_file_bytes / 1e9:.3f} GB (streamed from disk)",
        f"active per token  {active / 1e6:.1f} MB of experts ({top_k} x {len(layers)} layers)",
    ]


def _shard_lines(manifest) -> list[str]:
    shard = getattr(manifest, "shard", None)  # a download is never a shard
    if shard is None:
        return []
    return [
        f"shard             {shard.rank}/{shard.ranks} ({shard.assignment}): "
        f"{manifest.layers[0].num_experts} experts per layer here, the rest on the other ranks"
    ]


def _describe_quantization(params: dict) -> str:
    return f"{params['bits']}-bit {params.get('mode', 'affine')}, group {params['group_size']}"


DEMO_MODEL = Path(__file__).parent / "demo_model"
# 4-bit experts, as users run real models: on 8k held-out tokens the demo model's cross entropy is
# 4.955 nats unquantized (bf16), 4.955 at 8 bits and 4.965 at 4 bits (group 64), a 0.2% change.
DEMO_QUANTIZE = 4


def _demo(args: argparse.Namespace) -> int:
    prompt = _prompt(args)
    _import_exiting_on_ctrl_c("streamer.model", "streamer.generate", "streamer.repack")
    from .model import load
    from .repack import Quantize, repack

    with tempfile.TemporaryDirectory(prefix="streamer-demo-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        dst = work / "streaming"
        quantize = Quantize(DEMO_QUANTIZE) if DEMO_QUANTIZE else None
        precision = f"with {DEMO_QUANTIZE}-bit experts" if DEMO_QUANTIZE else "unquantized (bf16)"
        print(
            f"[demo] built-in model: a {_demo_size()} qwen3_moe trained on Python's standard "
            f"library (tools/train_demo.py); repacking it {precision} to {dst}",
            file=sys.stderr,
        )
        repack(DEMO_MODEL, dst, quantize=quantize, force=True)
        model, tokenizer = load(dst, memory_budget=0)  # stream every layer, to show the mechanism
        print(f"[demo] generating; expert weights are streamed from {dst}", file=sys.stderr)
        return _stream(model, tokenizer, prompt, args)


def _demo_size() -> str:
    from .io.json_file import read_json_object

    config = read_json_object(DEMO_MODEL / "config.json", "reinstall streamer.")
    layers, experts, k = (
        config["num_hidden_layers"],
        config["num_experts"],
        config["num_experts_per_tok"],
    )
    return f"{layers}-layer, {experts}-expert (top-{k})"


def _add_sampling(p: argparse.ArgumentParser, prompt_default: str | None) -> None:
    p.add_argument(
        "--prompt",
        default=prompt_default,
        required=prompt_default is None,
        help="text to continue ('-': read stdin)",
    )
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top")
    p.add_argument("--seed", type=int, default=None)


def _add_template(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system-prompt", default=None, help="a system message before the prompt")
    p.add_argument(
        "--ignore-chat-template",
        action="store_true",
        help="use the prompt as plain text even if the model has a chat template",
    )


def _add_loading(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--memory-budget",
        type=_size,
        default=None,
        help="bytes of experts to keep resident, e.g. 4G",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a tokenizer that ships Python code (Kimi K2)",
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="streamer", description="Run MoE LLMs larger than RAM by streaming experts from SSD."
    )
    ap.add_argument("--version", action="version", version=f"streamer {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("repack", help="convert a downloaded checkpoint into the streaming layout")
    p.add_argument("src", help="checkpoint folder (config.json + safetensors), or org/name")
    p.add_argument("dst", help="output folder")
    p.add_argument(
        "--quantize",
        type=int,
        choices=(2, 3, 4, 5, 6, 8),
        help="quantize to this many bits (affine)",
    )
    p.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128))
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted repack into DST from its last finished layer",
    )
    p.add_argument(
        "--delete-source",
        action="store_true",
        help="delete each of SRC's shards once all of its data is written into DST (the disk "
        "then needs about one shard beyond DST, not a second copy); resumable",
    )
    p.set_defaults(run=_repack)

    p = sub.add_parser(
        "split", help="write one rank's share of a repacked model, for expert-parallel runs"
    )
    p.add_argument("src", help="a folder written by `streamer repack`")
    p.add_argument("dst", help="output folder: the resident weights and this rank's experts")
    p.add_argument("--shard", required=True, metavar="RANK/RANKS", help="e.g. 0/2")
    p.add_argument(
        "--trace",
        help="routing trace (.npz, tools/routing_summary.py --trace) to balance the ranks' "
        "traffic; default: interleave experts",
    )
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.set_defaults(run=_split)

    p = sub.add_parser(
        "verify",
        help="check every checksum of a repacked model or a download; names each bad tensor",
    )
    p.add_argument("dir")
    p.add_argument(
        "--refresh",
        action="store_true",
        help="if every checksum passes, record the files' current times (after a copy)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="a download: compute its checksums and keep them in a sidecar (see --checksums)",
    )
    p.add_argument(
        "--checksums",
        metavar="FILE",
        help="a download's checksum sidecar (default: under the user cache folder, not in DIR)",
    )
    p.set_defaults(run=_verify)

    p = sub.add_parser(
        "generate", help="generate text from a repacked model or an MLX download (in place)"
    )
    p.add_argument(
        "--model",
        help="a folder written by `streamer repack` or `streamer split` (under mlx.launch, "
        "{rank} in it is replaced by the rank), an MLX download (in place), or org/name",
    )
    _add_sampling(p, None)
    p.add_argument(
        "--chat",
        action="store_true",
        help="the prompt is a chat message: refuse a model without a chat template",
    )
    _add_template(p)
    p.add_argument("--max-kv-size", type=int, default=None, help="keep at most N tokens of KV")
    p.add_argument(
        "--extra-eos-token",
        nargs="+",
        default=[],
        metavar="TOKEN",
        help="more tokens that end the answer (text or id)",
    )
    _add_loading(p)
    p.add_argument(
        "--read-path",
        choices=["slots", "mapped"],
        help="slots: a bounded slot pool filled by reads (default on Metal and CUDA); mapped: "
        "compute in place on the mapped files (default on the CPU)",
    )
    p.add_argument(
        "--verify-reads",
        action="store_true",
        help="check each expert's crc32 the first time it is read",
    )
    p.add_argument(
        "--checksums",
        metavar="FILE",
        help="an MLX download's checksum sidecar, if not the default (see `streamer verify`)",
    )
    p.set_defaults(run=_generate)

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server for a streamed model")
    p.add_argument(
        "--model",
        required=True,
        help="a repacked folder or MLX download, or org/name (hub cache)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    p.add_argument("--max-tokens", type=int, default=512, help="when a request sets none")
    p.add_argument("--temp", type=float, default=0.0, help="when a request sets none")
    p.add_argument("--top-p", type=float, default=1.0, help="when a request sets none")
    p.add_argument("--top-k", type=int, default=0, help="when a request sets none (0: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="when a request sets none (0: off)")
    p.add_argument("--prompt-cache-size", type=int, default=10, help="KV caches kept for reuse")
    _add_loading(p)
    p.set_defaults(run=_serve)

    p = sub.add_parser("chat", help="a conversation with a repacked model in the terminal")
    p.add_argument("--model", required=True, help="a repacked folder, or org/name (hub cache)")
    p.add_argument("--max-tokens", type=int, default=512, help="per answer")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top")
    p.add_argument("--seed", type=int, default=None)
    _add_template(p)
    _add_loading(p)
    p.set_defaults(run=_chat)

    p = sub.add_parser("plan", help="disk, memory and context a model needs, from its config.json")
    p.add_argument("source", help="config.json, a download's folder, a repacked one, or org/name")
    p.add_argument("--memory", type=_size, default=None, help="memory to plan for (default: free)")
    p.add_argument("--quantize", type=int, choices=(2, 3, 4, 5, 6, 8), help="as repack --quantize")
    p.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128))
    p.add_argument("--json", action="store_true", help="one JSON object, for tools")
    p.set_defaults(run=_plan)

    p = sub.add_parser("info", help="describe a repacked model")
    p.add_argument("dir")
    p.set_defaults(run=_info)

    p = sub.add_parser("demo", help="repack the built-in tiny trained MoE and generate (offline)")
    _add_sampling(p, 'def read_config(path):\n    """')
    p.add_argument("--keep", metavar="DIR", help="keep the repacked demo model in DIR")
    # a 3M-parameter model loops under greedy decoding; mild sampling with a fixed seed reads better
    p.set_defaults(run=_demo, max_tokens=40, temp=0.5, top_p=0.9, seed=0)
    return ap


def _size(text: str) -> int:
    try:
        return parse_size(text, "")
    except StreamerError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size such as 8G, 8GB, 8 GiB or 512M"
        ) from None


def _error_line(args: argparse.Namespace, error: StreamerError) -> str:
    """One line; in a group, naming the rank, and said once for a fault every rank finds."""
    text = " ".join(str(error).split())
    group = getattr(args, "group", None)
    if group is None:
        return f"streamer: error: {text}"
    from .distributed import GroupError

    if isinstance(error, GroupError):
        return f"streamer: error: {text}" if group.rank() == 0 else ""
    return f"streamer: error: rank {group.rank()}: {text}"


def main(argv: list[str] | None = None) -> int:
    """Run one command; errors are one line on stderr (exit 2), Ctrl-C exits 130 at any point,
    and a closed or full output ends quietly, as Unix tools end."""
    try:
        args = parser().parse_args(argv)
        return args.run(args) or 0
    except StreamerError as e:
        line = _error_line(args, e)
        return _report(line, 2) if line else 2
    except KeyboardInterrupt:
        return _interrupted_status()
    except ImportError as e:
        if not _interrupted(e):
            raise
        # Ctrl-C while a compiled extension (mlx's) initialises surfaces as its ImportError
        return _interrupted_status()
    except _OutputFailed as e:
        _silence_output()  # nothing more can be written there, nor flushed at exit
        if e.error.errno == errno.EPIPE:  # `streamer generate ... | head -c 3`: reader is done
            return 141  # what a shell reports for a tool ended by SIGPIPE
        return _report(f"streamer: error: cannot write the output: {e.error.strerror}", 1)
    except BrokenPipeError:  # stderr's reader went away (`2>&1 | head`)
        _silence_output()
        return 141


def _import_exiting_on_ctrl_c(*modules: str) -> None:
    """Import a command's modules (mlx, mlx-lm, transformers: seconds) with Ctrl-C ending the
    process once they are imported: CPython can report a KeyboardInterrupt raised inside
    importlib's lock
    callbacks as "ignored" and carry on, and nothing is written yet that an exit could leave
    half done."""
    if threading.current_thread() is not threading.main_thread():
        return

    def exit_130(*_) -> None:
        os.write(2, b"\nstreamer: interrupted\n")
        os._exit(130)

    # SIGINT is held blocked while the imports run: delivered inside mlx's extension start-up
    # it can abort the process (nanobind) or be swallowed by importlib. Any Ctrl-C meanwhile
    # is pending, and ends the process once the imports are done.
    previous = signal.signal(signal.SIGINT, exit_130)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for module in modules:
            importlib.import_module(module)
    finally:
        if signal.SIGINT in signal.sigpending():
            exit_130()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, previous)


def _interrupted_status() -> int:
    """Report Ctrl-C and ignore any further one: an interrupt that mlx's start-up turned into an
    ImportError can still be pending, and raised again on the way out it would end the process
    by SIGINT instead of with status 130."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return _report("\nstreamer: interrupted", 130)


def _interrupted(error: BaseException) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


class _OutputFailed(Exception):
    """Writing the command's output failed: its reader went away, or the device is full."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def _emit(text: str = "", end: str = "\n") -> None:
    """Write the command's output (generated text, info) to stdout."""
    try:
        print(text, end=end, flush=True)
    except OSError as e:
        raise _OutputFailed(e) from e


def _report(line: str, status: int) -> int:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass  # stderr itself is closed or full: the exit status still says it
    return status


def _silence_output() -> None:
    """Point stdout at /dev/null so that Python's flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
