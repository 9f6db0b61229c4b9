"""A generated token as OpenAI's logprobs carry it: its text, its bytes, its log-probability, and
the likeliest tokens at its step.

A token may be part of a character (one byte of a multi-byte one, in byte-level vocabularies):
its text is then "\ufffd", and only its bytes say what it is; a client joins the bytes of
consecutive tokens to rebuild the character (what OpenAI's `bytes` field is for).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper

# Byte-level BPE's alphabet (GPT-2's): a printable byte is spelled as its own character; each of
# the other 68 bytes as chr(256 + n), n counting those bytes in order.
_PRINTABLE = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
_BYTE_OF = {
    **{chr(b): b for b in _PRINTABLE},
    **{chr(256 + n): b for n, b in enumerate(sorted(set(range(256)) - set(_PRINTABLE)))},
}
_SENTENCEPIECE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


@dataclass
class Token:
    id: int
    text: str
    logprob: float
    bytes: bytes
    top: list[Token] = field(default_factory=list)  # the likeliest at this step, best first


def token_logprobs(tokenizer: TokenizerWrapper, lock: threading.Lock, response, top: int) -> Token:
    """The token of a generation `response` with its `top` likeliest alternatives; `lock`
    guards the tokenizer (HF fast tokenizers are not safe across threads)."""
    logprobs = response.logprobs
    ids, values = [response.token], [logprobs[response.token].item()]
    if top:
        likeliest = mx.argpartition(-logprobs, kth=top - 1)[:top]
        found = sorted(zip(logprobs[likeliest].tolist(), likeliest.tolist()), reverse=True)
        ids += [i for _, i in found]
        values += [v for v, _ in found]
    with lock:
        texts = [tokenizer.decode([i]) for i in ids]
        raw = [token_bytes(tokenizer, i, text) for i, text in zip(ids, texts)]
    token, *alternatives = (Token(*entry) for entry in zip(ids, texts, values, raw))
    token.top = alternatives
    return token


def token_bytes(tokenizer: TokenizerWrapper, token: int, text: str) -> bytes:
    """The bytes `token` stands for: its `text` (its decoding) encoded, unless that is not whole
    characters ("\ufffd"); then the vocabulary's own spelling of it gives them."""
    if "\ufffd" not in text:
        return text.encode()
    spelled = tokenizer.convert_ids_to_tokens(token) or ""
    if found := _SENTENCEPIECE_BYTE.fullmatch(spelled):
        return bytes([int(found.group(1), 16)])
    if spelled and all(c in _BYTE_OF for c in spelled):
        return bytes(_BYTE_OF[c] for c in spelled)
    return text.encode()  # a spelling of neither kind: the text is all there is
