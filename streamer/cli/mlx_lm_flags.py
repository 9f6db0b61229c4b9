"""mlx-lm's command-line flags (mlx_lm.generate, mlx_lm.chat, mlx_lm.server) that streamer does not
take, each with why and what to do instead: a user of mlx-lm types them, and "unrecognized
arguments" said neither."""

from __future__ import annotations

_API = "the Python API takes it (streamer.generate(..., {keyword}=...)), the command line does not"

MLX_LM_ONLY = {
    "--adapter-path": "streamer applies no LoRA adapters: fuse them into the model first "
    "(mlx_lm.fuse), then repack or pass the fused folder",
    "--xtc-probability": _API.format(keyword="xtc_probability"),
    "--xtc-threshold": _API.format(keyword="xtc_threshold"),
    "--min-tokens-to-keep": _API.format(keyword="min_tokens_to_keep"),
    "--prompt-cache-file": "chat and serve keep prompt caches in mlx-lm's files with "
    "--prompt-cache-dir DIR",
    "--chat-template": "streamer uses the model's own chat template: edit chat_template in "
    "tokenizer_config.json (or chat_template.jinja)",
    "--use-default-chat-template": "streamer uses the model's own chat template: edit "
    "chat_template in tokenizer_config.json (or chat_template.jinja)",
    "--prefill-response": "give the start of the answer in --prompt with --ignore-chat-template, "
    "after the template's text",
    "--image": "streamer computes text: images are not taken",
    "--quantize-activations": "streamer does not quantize activations",
    "--pipeline": "streamer runs several machines expert-parallel: `streamer launch` "
    "(docs/distributed.md)",
    "--decode-concurrency": "serve computes one sequence at a time (requests queue): on a disk "
    "bound a batch gains little (bench/findings.md, Batching)",
    "--prompt-concurrency": "serve computes one sequence at a time (requests queue): on a disk "
    "bound a batch gains little (bench/findings.md, Batching)",
    "--allowed-origins": "serve allows any origin, as mlx-lm's default does; --api-key guards it",
    "--log-level": "serve logs each request at one level",
    "--q-bits": "streamer's --quantize takes the bits: --quantize 4",
    "--hf-path": "repack takes the folders as SRC DST: streamer repack SRC DST",
    "--mlx-path": "repack takes the folders as SRC DST: streamer repack SRC DST",
}


def mlx_lm_only(option: str) -> str | None:
    """Why streamer does not take `option` (as typed, `--flag` or `--flag=value`), if it is one
    of mlx-lm's; else None."""
    name = option.split("=", 1)[0]
    reason = MLX_LM_ONLY.get(name)
    return f"{name} is mlx-lm's: {reason}" if reason else None
