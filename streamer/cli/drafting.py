"""The speculative decoding flags of generate, chat and serve: a draft model, or prompt lookup."""

from __future__ import annotations

import argparse

from ..arguments import check_at_least, check_draft_tokens
from ..errors import StreamerError


def add_drafting(p: argparse.ArgumentParser) -> None:
    p = p.add_argument_group("speculative decoding")
    p.add_argument(
        "--draft-model",
        metavar="DIR|org/name",
        help="speculative decoding: a small mlx-lm model with the same tokenizer, kept resident, "
        "drafts tokens the streamed model checks several per pass (one expert read and one sync "
        "per layer for all); the output is what decoding without it gives",
    )
    p.add_argument(
        "--prompt-lookup",
        nargs="?",
        const=True,
        type=int,
        metavar="NGRAM",
        help="speculative decoding without a draft model: draft what followed the latest earlier "
        "occurrence of the last NGRAM tokens (default 3, then fewer) in the prompt and output; "
        "pays off where text repeats (code edits, quoting)",
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        metavar="N",
        help="tokens drafted per pass (default: 3, as mlx_lm.generate)",
    )


def check_drafting(args: argparse.Namespace) -> None:
    """The drafting flags, checked before anything loads."""
    if args.draft_model is not None and args.prompt_lookup is not None:
        raise StreamerError("give --draft-model or --prompt-lookup, not both: one drafter drafts.")
    drafting = args.draft_model is not None or args.prompt_lookup is not None
    if drafting and getattr(args, "max_kv_size", None) is not None:  # generate's and chat's flag
        raise StreamerError(
            "--max-kv-size cannot be combined with --draft-model or --prompt-lookup: drafting "
            "into a bounded KV cache is not checked exact yet."
        )
    if args.prompt_lookup not in (None, True):
        check_at_least(args.prompt_lookup, "--prompt-lookup", 1)
    if args.num_draft_tokens is not None:
        if args.draft_model is None and args.prompt_lookup is None:
            raise StreamerError("--num-draft-tokens drafts with --draft-model or --prompt-lookup.")
        check_draft_tokens(args.num_draft_tokens, "--num-draft-tokens", 1)


def draft_options(args: argparse.Namespace, model, tokenizer) -> dict:
    """streamer.generate's keywords for the drafting flags: the draft model loaded once (checked
    against the streamed `model`'s tokenizer, in its load's dtype). On an expert-parallel group
    every rank loads it and drafts alike (streamer/speculative/loop.py checks that they do)."""
    if args.draft_model is None and args.prompt_lookup is None:
        return {}
    options = {"num_draft_tokens": args.num_draft_tokens} if args.num_draft_tokens else {}
    if args.prompt_lookup is not None:
        return {**options, "prompt_lookup": args.prompt_lookup}
    from ..speculative.draft_model import load_draft_model

    return {
        **options,
        "draft_model": load_draft_model(args.draft_model, tokenizer, model.streamer.load_dtype),
    }
