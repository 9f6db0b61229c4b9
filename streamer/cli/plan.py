"""`streamer plan`: the disk, memory and context a model needs, before any download or repack."""

from __future__ import annotations

import argparse

from ..arguments import DTYPE_NAMES, KV_BITS, KV_GROUP_SIZE, KV_GROUP_SIZES
from ..errors import StreamerError
from .options import add_quantize, quantize_option, size
from .output import emit


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="disk, memory and context a model needs, from its config.json")
    p.add_argument(
        "source",
        metavar="SOURCE",
        help="config.json, a download's folder, a repacked one, or org/name",
    )
    p.add_argument(
        "--memory",
        type=size,
        metavar="SIZE",
        help="memory to plan for (default: what is free; on a GPU the GPU's)",
    )
    add_quantize(p, "as repack --quantize")
    p.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        help="plan a load given this --dtype (default: a load's here: float32 on the CPU, the "
        "checkpoint's own on a GPU)",
    )
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=KV_BITS,
        help="count the KV cache quantized to this many bits (generate's --kv-bits)",
    )
    p.add_argument(
        "--kv-group-size",
        type=int,
        choices=KV_GROUP_SIZES,
        default=KV_GROUP_SIZE,
        help="the KV cache's quantization group size (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object, for tools")
    p.set_defaults(run=plan)


def plan(args: argparse.Namespace) -> None:
    from ..loading.backend import available_memory
    from ..loading.hub import NotCached, model_path, resolve
    from ..loading.options import load_options
    from ..plan import plan

    dtype = load_options(dtype=args.dtype, option="--").dtype  # as a load decides it
    # not given: what a load's plan would read (on CUDA the GPU's free memory: loading/backend.py)
    memory = available_memory().available if args.memory is None else args.memory
    q = quantize_option(args)
    quantize = q and (q.bits, q.group_size, q.mode)
    kv = (args.kv_bits, args.kv_group_size) if args.kv_bits else None
    # --quantize plans a repack of the download; without it, a pulled name is its repacked folder
    # (config.json is all a plan needs: `hf download org/name config.json` caches it alone)
    try:
        if quantize:
            source = resolve(args.source, config_only=True)
        else:
            source = model_path(args.source, config_only=True)
    except NotCached as e:  # not the whole model's download, which NotCached's words say
        raise StreamerError(
            f"{e.name} is neither a folder nor in the Hugging Face cache: plan reads its "
            f"config.json alone, which `hf download {e.name} config.json` fetches."
        ) from None
    result = plan(source, memory, quantize=quantize, dtype=dtype, kv=kv)
    emit(result.json() if args.json else "\n".join(result.lines()))
