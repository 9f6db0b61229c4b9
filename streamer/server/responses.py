"""Response bodies in OpenAI's shapes (chat.completion, chat.completion.chunk, text_completion).

streamer's own figures ride along under a `streamer` key, which OpenAI clients ignore.
"""

from __future__ import annotations

import logging
import time
import uuid

from mlx_lm.server import ToolCallFormatter

from ..run_stats import RunStats
from .api import Completion
from .jobs import Done
from .logprobs import Token
from .output import Piece

log = logging.getLogger("streamer.server")


class Answer:
    """Builds one request's response bodies, streamed or whole."""

    def __init__(self, request: Completion, tool_parser):
        self.request = request
        self.id = f"{'chatcmpl' if request.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.tool_calls = ToolCallFormatter(tool_parser, request.tools, streaming=request.stream)
        self.piece, self.tokens = Piece(), []  # everything so far, for a whole response
        self.sent = 0  # characters of text streamed so far (text_offset of /v1/completions)
        self.role_sent = False  # a streamed answer names its role once, in its first chunk
        self.called = False  # whether a tool call reached the answer (some may be dropped)

    def _calls(self, texts: list[str]) -> list[dict]:
        """The tool calls in OpenAI's shape. mlx-lm's formatter drops a call its parser cannot
        read, but raised on one that parses to other than {name, arguments} (a model's
        `{"name": "f"}`): the answer was lost, a traceback logged. Such a call is dropped too."""
        calls = []
        for text in texts:
            try:
                calls += self.tool_calls([text])
            except (AttributeError, KeyError, TypeError):
                log.warning("dropped a tool call that is not {name, arguments}: %.200r", text)
        self.called = self.called or bool(calls)
        return calls

    def _finish(self, finish: str | None) -> str | None:
        """ "tool_calls" only where a call reached the answer: one whose every call was dropped
        said so with none in it, and OpenAI's clients look for them."""
        return "stop" if finish == "tool_calls" and not self.called else finish

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.request.model}

    # streamed
    def chunk(self, piece: Piece, tokens: list[Token], finish: str | None = None) -> dict:
        if not self.request.chat:
            body = self._head("text_completion")
            logprobs = self._text_logprobs(tokens, self.sent) if self.request.logprobs else None
            choice = {"index": 0, "text": piece.content, "logprobs": logprobs}
            self.sent += len(piece.content)
        else:
            body = self._head("chat.completion.chunk")
            # OpenAI's client joins the deltas' strings: a role in every chunk was read as
            # "assistantassistant..." by its streaming helper (chat.completions.stream)
            delta = {} if self.role_sent else {"role": "assistant"}
            self.role_sent = True
            if piece.content:
                delta["content"] = piece.content
            if piece.reasoning:
                delta["reasoning"] = piece.reasoning
            if calls := self._calls(piece.tool_calls):
                delta["tool_calls"] = calls
            choice = {"index": 0, "delta": delta}
            if self.request.logprobs:
                choice["logprobs"] = {"content": self._chat_logprobs(tokens)}
        choice["finish_reason"] = self._finish(finish)
        body["choices"] = [choice]
        if self.request.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, done: Done) -> dict:
        kind = "chat.completion.chunk" if self.request.chat else "text_completion"
        return {
            **self._head(kind),
            "choices": [],
            "usage": _usage(done),
            "streamer": stats_json(done.stats),
        }

    # whole
    def add(self, piece: Piece, tokens: list[Token]) -> None:
        self.piece.content += piece.content
        self.piece.reasoning += piece.reasoning
        self.piece.tool_calls += piece.tool_calls
        self.tokens += tokens

    def whole(self, done: Done) -> dict:
        piece, tokens = self.piece, self.tokens
        if not self.request.chat:
            body = self._head("text_completion")
            logprobs = self._text_logprobs(tokens, 0) if self.request.logprobs else None
            choice = {"index": 0, "text": piece.content, "logprobs": logprobs}
        else:
            body = self._head("chat.completion")
            calls = self._calls(piece.tool_calls)
            # null only beside tool calls, as OpenAI answers; an empty answer is ""
            message = {"role": "assistant", "content": piece.content or (None if calls else "")}
            if piece.reasoning:
                message["reasoning"] = piece.reasoning
            if calls:
                message["tool_calls"] = calls
            choice = {"index": 0, "message": message}
            choice["logprobs"] = (
                {"content": self._chat_logprobs(tokens)} if self.request.logprobs else None
            )
        choice["finish_reason"] = self._finish(done.finish_reason)
        body["choices"] = [choice]
        body["usage"] = _usage(done)
        body["streamer"] = stats_json(done.stats)
        return body

    @staticmethod
    def _chat_logprobs(tokens: list[Token]) -> list[dict]:
        def entry(token: Token) -> dict:
            return {"token": token.text, "logprob": token.logprob, "bytes": list(token.bytes)}

        return [{**entry(t), "top_logprobs": [entry(s) for s in t.top]} for t in tokens]

    @staticmethod
    def _text_logprobs(tokens: list[Token], offset: int) -> dict:
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t.text)
        return {
            "tokens": [t.text for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [_by_text(t.top) for t in tokens],
            "text_offset": offsets,
        }


def _by_text(top: list[Token]) -> dict[str, float]:
    """The legacy top_logprobs: a dict by token text. Tokens that decode alike (byte pieces of
    one character, each "\ufffd") are one entry, with the best logprob, not the last one's."""
    by_text: dict[str, float] = {}
    for token in top:  # best first
        by_text.setdefault(token.text, token.logprob)
    return by_text


def _usage(done: Done) -> dict:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }


def stats_json(stats: RunStats | None) -> dict:
    """streamer's figures for one request, under the `streamer` key of a response."""
    if stats is None:
        return {}
    return {
        "prompt_tokens_per_second": round(stats.prompt_tps, 3),
        "generation_tokens_per_second": round(stats.generation_tps, 3),
        "expert_mb_per_token": round(stats.expert_bytes_per_token / 1e6, 4),
        "expert_reads_per_token": round(stats.expert_reads_per_token, 3),
        "page_cache_hit_rate": stats.page_cache_hit_rate,
        "syncs_per_token": round(stats.syncs_per_token, 3),
        "peak_rss_bytes": stats.peak_rss_bytes,  # mapped file pages counted too
        "peak_mlx_bytes": stats.peak_mlx_bytes,
        "rss_anon_bytes": stats.rss_anon_bytes,  # the process's own, at the end (Linux)
        "rss_file_bytes": stats.rss_file_bytes,  # mapped file pages resident then (Linux)
        "dtype": stats.dtype,  # what the model computed in (--dtype)
        **_drafts_json(stats),
    }


def _drafts_json(stats: RunStats) -> dict:
    """With drafts: the share kept, tokens per verify pass, expert MB read for rejected drafts."""
    drafts = stats.drafts
    if drafts is None:
        return {}
    return {
        "drafts_kept": round(drafts.accepted / drafts.drafted, 4) if drafts.drafted else None,
        "tokens_per_pass": round(drafts.emitted / drafts.passes, 3),
        "wasted_expert_mb_per_token": round(stats.wasted_bytes_per_token / 1e6, 4),
    }
