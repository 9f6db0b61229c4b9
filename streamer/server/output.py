"""The model's text -> what a response carries: content cut exactly at a stop string, reasoning,
and tool calls, split by mlx-lm's text state machine (the template's markers stripped)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlx_lm.generate import TextStateMachine, make_text_state_machine
from mlx_lm.tokenizer_utils import TokenizerWrapper


@dataclass
class Piece:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[str] = field(default_factory=list)  # the raw text of each finished call

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


class StopStrings:
    """Holds back text that may be the start of a stop string; cuts at the first full match.

    Each stop's longest partial match is followed a character at a time (Knuth-Morris-Pratt), so
    a token costs steps in proportion to its own text, not to the stops' length (16 stops of 1,000
    characters cost 16,000 steps a token when each held-back end was compared again)."""

    def __init__(self, stops: list[str]):
        self.stops, self.held = stops, ""
        self.matchers = [_Matcher(s) for s in stops]

    def feed(self, text: str) -> tuple[str, bool]:
        completed = [m.feed(text) for m in self.matchers]  # each matcher reads all of `text`
        text = self.held + text
        if any(completed):  # where the earliest of them starts, as when text holds several
            cut = min(i for i in (text.find(s) for s in self.stops) if i >= 0)
            self.held = ""
            return text[:cut], True
        keep = max((m.matched for m in self.matchers), default=0)
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        text, self.held = self.held, ""
        return text


class _Matcher:
    """How much of one stop string the text read so far ends with."""

    def __init__(self, stop: str):
        self.stop, self.matched = stop, 0
        # fallback[k]: the longest proper end of stop[:k + 1] that also begins the stop
        self.fallback = [0] * len(stop)
        k = 0
        for i in range(1, len(stop)):
            k = self._step(k, stop[i])
            self.fallback[i] = k

    def feed(self, text: str) -> bool:
        """Whether the stop string ends within `text`."""
        for character in text:
            self.matched = self._step(self.matched, character)
            if self.matched == len(self.stop):
                return True
        return False

    def _step(self, k: int, character: str) -> int:
        while k and self.stop[k] != character:
            k = self.fallback[k - 1]
        return k + (self.stop[k] == character)


class Output:
    def __init__(
        self,
        tokenizer: TokenizerWrapper,
        prompt: list[int],
        stops: list[str],
        split: bool = True,
        calls: bool = True,
        one_call: bool = False,
    ):
        """`split`: reasoning and tool calls taken out of the content, their markers stripped (a
        chat's answer); else the text as the model wrote it (/v1/completions, whose text had
        lost a tool call or think block the model wrote). `calls`: whether the request gave
        tools to call; where not, a call the model writes stays text (`_end_call`). `one_call`:
        the answer ends at its first call (a request's parallel_tool_calls: false)."""
        self.stops, self.split, self.calls = StopStrings(stops), split, calls
        self.one_call = one_call
        self.call_markers = tokenizer.tool_call_start or "", tokenizer.tool_call_end or ""
        self.machine = make_text_state_machine(tokenizer)
        self.state = self.machine.make_state(_initial_state(tokenizer, prompt))
        self.tool_text = ""
        self.made_tool_call = False

    def feed(self, text: str) -> tuple[Piece, bool]:
        """The piece to send for `text`, and whether a stop string (or, with `one_call`, a call)
        ended the answer."""
        text, stopped = self.stops.feed(text)
        piece = self._pieces(text)
        if stopped:
            piece = self._merge(piece, self.finish())
        return piece, stopped or (self.one_call and self.made_tool_call)

    def _pieces(self, text: str) -> Piece:
        if not self.split:
            return Piece(content=text)
        self.state, segments = TextStateMachine.split(self.state, text)
        return self._collect(segments)

    def finish(self) -> Piece:
        """Whatever is still held back, at the end of the answer."""
        if not self.split:
            return Piece(content=self.stops.flush())
        self.state, segments = TextStateMachine.split(self.state, self.stops.flush())
        piece = self._collect(segments)
        self.state, rest, name = TextStateMachine.flush(self.state)
        piece = self._merge(piece, self._collect([(name, rest)]))
        if self.tool_text:  # a call the answer ended inside
            self._end_call(piece, closed=False)
        return piece

    def _collect(self, segments: list[tuple[str | None, str]]) -> Piece:
        piece = Piece()
        for name, text in segments:
            if name == "tool":
                self.tool_text += text
                continue
            if self.tool_text:  # the state left "tool": that call is complete
                self._end_call(piece, closed=True)
            if name == "reasoning":
                piece.reasoning += text
            else:
                piece.content += text
        return piece

    def _end_call(self, piece: Piece, closed: bool) -> None:
        """The call the model wrote (`closed`: to its end marker): a tool call, or where the
        request gave no tools its text with the markers, as written: OpenAI answers no calls
        then, and an agent that reads calls out of the text (its tools in its prompt) got an
        empty answer."""
        if not self.calls:
            start, end = self.call_markers
            piece.content += start + self.tool_text + (end if closed else "")
        elif not (self.one_call and self.made_tool_call):  # a second one in one piece is dropped
            piece.tool_calls.append(self.tool_text)
            self.made_tool_call = True
        self.tool_text = ""

    @staticmethod
    def _merge(a: Piece, b: Piece) -> Piece:
        return Piece(a.content + b.content, a.reasoning + b.reasoning, a.tool_calls + b.tool_calls)


def _initial_state(tokenizer: TokenizerWrapper, prompt: list[int]) -> str:
    """'reasoning' when the prompt ends inside a think block (as mlx-lm's server decides)."""
    state = "normal"
    if tokenizer.has_thinking and tokenizer.rfind_think_start(prompt) > tokenizer.rfind_think_end(
        prompt
    ):
        state = "reasoning"
    return tokenizer.response_initial_state or state
