"""Defaults that the Python API and the command line share, named once: a signature's default
and its flag's are the same name (tests/test_cli_details.py checks that they agree)."""

# Prompt tokens computed at a time: mlx-lm's default (mlx_lm.generate, chat and server alike)
PREFILL_STEP = 2048
# Tokens an answer of chat or serve may take where none is asked: mlx_lm.server's --max-tokens
MAX_TOKENS = 512
# KV caches a server keeps for reuse: mlx_lm.server's --prompt-cache-size
PROMPT_CACHE_SIZE = 10
