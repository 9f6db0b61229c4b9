"""Logprobs of tokens that are part of a character: their `bytes` are the token's own, so a client
that joins them gets the character back (each one's text is "\ufffd")."""

from __future__ import annotations

from serving import HELLO

from streamer.server.logprobs import token_bytes


def test_a_byte_token_carries_its_byte(client, served_folder, local):
    """A token that is one byte of "é": its bytes were those of "\ufffd" (EF BF BD)."""
    _, tokenizer = local
    first, second = tokenizer.encode("é", add_special_tokens=False)
    answer = client.chat.completions.create(
        model=str(served_folder),
        messages=HELLO,
        max_tokens=2,
        logprobs=True,
        top_logprobs=2,
        logit_bias={str(first): 100},  # every token is the first byte of "é"
    )
    content = answer.choices[0].logprobs.content
    assert [(c.token, c.bytes) for c in content] == [("\ufffd", [0xC3])] * 2
    assert token_bytes(tokenizer, second, "\ufffd") == b"\xa9"


class _SentencePiece:
    """A SentencePiece vocabulary's spelling of its byte tokens."""

    def convert_ids_to_tokens(self, token: int) -> str:
        return {1: "<0xE4>", 2: "▁the"}[token]


def test_byte_tokens_of_either_vocabulary_kind():
    assert token_bytes(_SentencePiece(), 1, "\ufffd") == b"\xe4"
    assert token_bytes(_SentencePiece(), 2, "the") == b"the"  # whole characters: as decoded
