"""A model's tokenizer, built exactly as mlx_lm.load builds it, its faults as one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StreamerError, one_line
from ..families.config import check_eos_ids, context_length
from ..io.checkpoint import TOKENIZER_FILES, has_tokenizer_files
from ..io.files import read_bytes

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def load_tokenizer(
    folder: Path,
    trust_remote_code: bool,
    tokenizer_config: dict | None = None,
    embedded: int | None = None,
) -> TokenizerWrapper:
    """The tokenizer exactly as mlx_lm.load builds it: its eos ids are config.json's, replaced by
    generation_config.json's where that file lists them (chat models' end-of-turn ids);
    `tokenizer_config`: the user's extra arguments for transformers' AutoTokenizer, as mlx-lm's;
    `embedded`: the tokens the model embeds (embedded_tokens), past which it gives no id."""
    # mlx_lm.utils imports transformers (seconds): here, not by every module that loads a model,
    # so that a command refused before its tokenizer is built is refused at once
    from mlx_lm.utils import load_config
    from mlx_lm.utils import load_tokenizer as mlx_lm_load_tokenizer

    try:
        config = load_config(folder)
        eos_ids = config.get("eos_token_id")
    except (OSError, ValueError) as e:
        raise StreamerError(
            f"{folder / 'config.json'} cannot be read ({one_line(e)}); repack the model."
        ) from e
    except AttributeError as e:  # mlx-lm reads generation_config.json's eos ids with .get
        raise StreamerError(
            f"{folder / 'generation_config.json'} is not a JSON object; download it again or "
            "delete it."
        ) from e
    check_eos_ids(eos_ids, folder / "generation_config.json")
    if not has_tokenizer_files(folder):
        raise StreamerError(
            f"{folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)}): copy them from the "
            "original model into it."
        )
    extra = {"trust_remote_code": True} if trust_remote_code else {}
    extra.update(_config_unbuilt(folder, config))
    extra.update(tokenizer_config or {})
    _check_named_templates(folder, extra)
    try:
        tokenizer = mlx_lm_load_tokenizer(
            folder, tokenizer_config_extra=extra, eos_token_ids=eos_ids
        )
    except Exception as e:  # transformers' own errors have no common base; name what failed
        tokenizer_config = folder / "tokenizer_config.json"
        ships_code = tokenizer_config.exists() and "auto_map" in tokenizer_config.read_text(
            errors="replace"
        )
        refused = _config_refused(e, folder / "config.json", config)
        if refused is not None:
            raise refused from e
        if ships_code and not trust_remote_code:
            raise StreamerError(
                f"{folder}: this model's tokenizer is Python code shipped with the model (auto_map "
                "in tokenizer_config.json). If you trust it, pass trust_remote_code=True (CLI: "
                "--trust-remote-code)."
            ) from e
        raise StreamerError(
            f"{folder}: cannot load the tokenizer ({type(e).__name__}: {one_line(e)}); check "
            "tokenizer.json and tokenizer_config.json, or copy them from the original model."
        ) from e
    _context_as_max_length(tokenizer, config)
    _check_ids_embedded(tokenizer, embedded, folder)
    return tokenizer


def _check_named_templates(folder: Path, extra: dict) -> None:
    """Refuse a chat_template list in transformers' named form, [{"name": ..., "template": ...}],
    that transformers would fail on in a message blaming tokenizer.json (an entry not an object, or
    lacking a name or template), keep the last of two entries named alike without a word, or take
    with a template that is not text (failing only when a prompt is rendered). Checked where the
    template used comes from: the user's tokenizer_config, else tokenizer_config.json unless a
    chat_template.jinja or chat_templates/ file replaces it (transformers reads those first)."""
    if "chat_template" in extra:
        _check_template_list(extra["chat_template"], "tokenizer_config's chat_template")
        return
    where = folder / "tokenizer_config.json"
    if (folder / "chat_template.jinja").exists() or any(folder.glob("chat_templates/*.jinja")):
        return
    try:
        config = json.loads(read_bytes(where, "the tokenizer's config"))
    except (OSError, ValueError):
        return  # transformers' own reading says what is wrong with the file
    if isinstance(config, dict):
        _check_template_list(config.get("chat_template"), f"{where}: chat_template")


def _check_template_list(templates: object, where: str) -> None:
    if not isinstance(templates, list):
        return
    if not templates:  # transformers takes it as a template every render fails on
        raise StreamerError(
            f"{where}: the list names no template; give "
            '[{"name": "default", "template": "..."}], or leave chat_template out.'
        )
    names = set()
    for number, entry in enumerate(templates):
        fault = _entry_fault(entry, names)
        if fault is not None:
            raise StreamerError(
                f"{where}: entry {number} {fault}; each entry is "
                '{"name": "default", "template": "..."}, its name given once.'
            )
        names.add(entry["name"])


def _entry_fault(entry: object, names: set[str]) -> str | None:
    if not isinstance(entry, dict):
        return f"is {type(entry).__name__}, not an object"
    for key in ("name", "template"):
        value = entry.get(key)
        if not isinstance(value, str):
            kind = "null" if value is None else type(value).__name__
            what = kind if key in entry else "missing"
            return f"{key} is {what}, not text"
    if entry["name"] in names:
        return f"names {entry['name']!r} again"
    return None


# The last part of the name of the token embedding in mlx-lm's models
EMBEDDING_NAMES = ("embed_tokens", "word_embeddings", "wte", "embeddings")


def embedded_tokens(model: nn.Module) -> int | None:
    """How many tokens `model`'s token embedding has rows for (None: no embedding so named)."""
    import mlx.nn as nn

    for name, module in model.named_modules():
        if name.rpartition(".")[2] in EMBEDDING_NAMES and isinstance(
            module, (nn.Embedding, nn.QuantizedEmbedding)
        ):
            return module.weight.shape[0]
    return None


def _check_ids_embedded(tokenizer: TokenizerWrapper, embedded: int | None, folder: Path) -> None:
    """Refuse a tokenizer that gives an id past the model's embedding (another model's tokenizer
    files, or edited ones): a prompt holding that token read the embedding out of bounds, other
    text without a word or a segmentation fault."""
    vocabulary = tokenizer.get_vocab()  # added tokens too
    if embedded is None or not vocabulary or max(vocabulary.values()) < embedded:
        return
    token = max(vocabulary, key=vocabulary.__getitem__)
    raise StreamerError(
        f"{folder}: the tokenizer gives {token!r} the id {vocabulary[token]}, but the model "
        f"embeds {embedded} tokens (ids 0 to {embedded - 1}): the tokenizer files belong to "
        "another model (copy the model's own), or a token given in tokenizer_config is not in "
        "its vocabulary (give one that is)."
    )


def _config_refused(error: BaseException, where: Path, config: dict) -> StreamerError | None:
    """The fault named in config.json where the tokenizer failed because transformers' config
    class refused config.json (AutoTokenizer builds the model's config first: a field of the wrong
    type, as `n_shared_experts: null`, blamed tokenizer.json); None where something else failed.
    Its strict dataclasses raise these errors and nothing else does."""
    from huggingface_hub.errors import StrictDataclassError

    while error is not None and not isinstance(error, StrictDataclassError):
        error = error.__cause__ or error.__context__
    if error is None:
        return None
    named = re.match(r"Validation error for field '([^']*)'", str(error))
    why = one_line(error.__cause__ or error)
    what = f"{named[1]} is" if named else "it is"
    return StreamerError(
        f"{where}: {what} refused by transformers' {config.get('model_type')} config class, "
        f"built to load the tokenizer ({why}); set it as the model's published config.json does."
    )


def _context_as_max_length(tokenizer: TokenizerWrapper, config: dict) -> None:
    """The tokenizer's model_max_length raised to the model's context (max_position_embeddings):
    a tokenizer_config.json's smaller one (2048 where the model reads 40960) made transformers log
    "Token indices sequence length is longer than the specified maximum sequence length" for a
    prompt well inside the context. A prompt past the context is refused by streamer itself, in
    one line: the warning, which transformers gives once, is marked given."""
    context = context_length(config)
    own = tokenizer._tokenizer
    if type(context) is int and context > getattr(own, "model_max_length", context):
        own.model_max_length = context
    if isinstance(getattr(own, "deprecation_warnings", None), dict):
        own.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True


def _config_unbuilt(folder: Path, config: dict) -> dict:
    """For a model type transformers does not know (Kimi K2's kimi_k2): AutoTokenizer's `config`,
    the generic one it falls back to, without the model's fields. Left to build it, transformers 5
    builds it from config.json and fails on a rope_scaling there ("'PreTrainedConfig' object has
    no attribute 'max_position_embeddings'", as mlx-lm does); the tokenizer reads only its
    tokenizer_class and name. A model type it knows: nothing (it builds its own config class)."""
    from transformers import PreTrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type in CONFIG_MAPPING:
        return {}
    generic = PreTrainedConfig(tokenizer_class=config.get("tokenizer_class"))
    generic._name_or_path = str(folder)
    return {"config": generic}
