"""Lists of one-letter layer kinds a config.json writes as one string (Nemotron-H's layer
pattern), read as the list mlx-lm's model iterates."""

from __future__ import annotations

# Lists of one-letter layer kinds published as one string (Nemotron-H's "ME*EME", in NVIDIA's
# configs and as transformers writes it): model_type -> field -> the letters mlx-lm's model builds.
# mlx-lm iterates the string, a letter a layer, as the list; one with another letter stays refused.
LETTER_LISTS = {"nemotron_h": {"hybrid_override_pattern": "M*-E"}}


def letters_listed(config: dict) -> dict:
    """`config` with LETTER_LISTS' strings as the lists of letters mlx-lm computes from them."""
    listed = {
        name: list(config[name])
        for name, letters in LETTER_LISTS.get(config.get("model_type"), {}).items()
        if isinstance(config.get(name), str) and set(config[name]) <= set(letters)
    }
    return {**config, **listed} if listed else config
