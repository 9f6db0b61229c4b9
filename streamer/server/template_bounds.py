"""A chat template rendered within bounds: the model's template is code from its files, and one
that loops without end or makes a text of gigabytes (`{{ messages[0].content * 100000000 }}`)
rendered until the process was killed, holding serve's tokenizer (every request) meanwhile.

transformers compiles templates in jinja's immutable sandbox, which bounds range() but neither
time nor size. Where streamer renders, the same template is compiled by BoundedEnvironment: the
sandbox with transformers' own filters, globals and options (the same text out, byte for byte),
whose every loop step and call checks the render's deadline, whose string and integer operations
check their result's size before making it, and whose output is counted as it is joined. Each
check is a comparison, and the bounds are the render's thread's: serve's handler threads, where
no signal reaches, are bounded as the main thread is.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum
from jinja2.visitor import NodeTransformer
from transformers.utils import chat_template_utils

from ..arguments import tokens_text
from ..errors import StreamerError

RENDER_SECONDS = 10.0  # a long conversation renders in milliseconds
# More bytes of text a token than any prompt averages (English takes about 4, code 3 to 4, Chinese
# about 3): a prompt over its context's worth of them is refused before it is tokenized. The
# tokenizer is shared (one lock): a 30 MB prompt held every other request's tokenization 30 s.
MAX_BYTES_PER_TOKEN = 32
UNKNOWN_CONTEXT = 1 << 20  # tokens taken as the context of a model whose config.json gives none
MAX_INTEGER_BITS = 1 << 16  # a template prints none over 4300 digits (Python's own limit)
# Published templates are tens of KB; compiling is out of the deadline's reach (2 MB took 25 s)
MAX_TEMPLATE_CHARACTERS = 1 << 20


class TemplateBoundPassed(StreamerError):
    """A chat template that ran past its time or made more text than the context holds."""


@dataclass
class Bounds:
    """One render's: its deadline, the characters the prompt may have, its template's file."""

    deadline: float
    most: int
    context: int | None
    template: str

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateBoundPassed(
                f"the model's chat template ({self.template}) did not finish rendering the prompt "
                f"in {RENDER_SECONDS:g} s (a loop without end?): fix the template."
            )

    def check_size(self, characters: int) -> None:
        if characters > self.most:
            context = f"{tokens_text(self.context)}" if self.context else "no stated length"
            raise TemplateBoundPassed(
                f"the model's chat template ({self.template}) makes a text of over {self.most:,} "
                f"characters, more than the model's context ({context}) holds at "
                f"{MAX_BYTES_PER_TOKEN} bytes a token: shorten the messages, or fix the template."
            )

    def check_source(self, characters: int) -> None:
        if characters > MAX_TEMPLATE_CHARACTERS:
            raise TemplateBoundPassed(
                f"the model's chat template ({self.template}) is {characters:,} characters long, "
                f"over the {MAX_TEMPLATE_CHARACTERS:,} a template may have: fix the template."
            )

    def check_integer(self, bits: int) -> None:
        if bits > MAX_INTEGER_BITS:
            raise TemplateBoundPassed(
                f"the model's chat template ({self.template}) computes an integer of over "
                f"{MAX_INTEGER_BITS:,} bits: fix the template."
            )


_rendering = threading.local()  # .bounds: this thread's render's, None between renders


def render(tokenizer, context: int | None, *args, **kwargs):
    """`tokenizer.apply_chat_template(*args, **kwargs)`, its template rendered within RENDER_SECONDS
    and the text the model's `context` holds; TemplateBoundPassed past either."""
    _rendering.bounds = Bounds(
        time.monotonic() + RENDER_SECONDS,
        (context or UNKNOWN_CONTEXT) * MAX_BYTES_PER_TOKEN,
        context,
        template_file(tokenizer),
    )
    try:
        return tokenizer.apply_chat_template(*args, **kwargs)
    finally:
        _rendering.bounds = None


def template_file(tokenizer) -> str:
    """The file the template comes from, as transformers reads it (chat_template.jinja first)."""
    folder = Path(getattr(tokenizer, "name_or_path", "") or ".")
    jinja = "chat_template.jinja"
    return jinja if (folder / jinja).is_file() else "chat_template in tokenizer_config.json"


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox with the render's bounds: made from its environment (overlay), so
    its filters, globals and whitespace options are those transformers renders with."""

    intercepted_binops = frozenset(("+", "*", "**"))  # the operators whose result can explode

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _Checked().visit(super()._parse(source, name, filename))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        _rendering.bounds.check_time()  # a macro's or a method's: recursion that fans out
        if isinstance(getattr(__obj, "__self__", None), str) and __obj.__name__ in PADDING:
            _check_widths(args, kwargs)
        return _sized(super().call(__context, __obj, *args, **kwargs))  # s.replace: doubles s

    def call_binop(self, context, operator: str, left, right):
        _check_binop(_rendering.bounds, operator, left, right)
        return super().call_binop(context, operator, left, right)

    def concat(self, pieces: Iterable[str]) -> str:
        """The output joined (Template.render's), counted as it comes."""
        bounds, kept, size = _rendering.bounds, [], 0
        for piece in pieces:
            size += len(piece)
            bounds.check_size(size)
            kept.append(piece)
        return "".join(kept)


# Filters no template can name (a name with a space): each a plain call in the compiled code,
# where a method of the environment would be a call through the sandbox
PACED, SIZED = "streamer paced", "streamer sized"
PADDING = ("center", "ljust", "rjust", "zfill", "expandtabs")  # str's methods a width makes long


def _paced(items: Iterable) -> Iterator:
    """A loop's items, the deadline checked before each (a loop over a list runs no call)."""
    bounds = _rendering.bounds
    for item in items:
        bounds.check_time()
        yield item


def _check_widths(args: tuple, kwargs: dict) -> None:
    """A padding's width checked before the text is made (`s.center(10**11)` is 100 GB)."""
    for width in (*args, *kwargs.values()):
        if isinstance(width, int):
            _rendering.bounds.check_size(width)


def _widths_checked(pad: Callable) -> Callable:
    """A padding filter (center, indent) that checks its width first."""

    @functools.wraps(pad)
    def checked(value, *args, **kwargs):
        _check_widths(args, kwargs)
        return pad(value, *args, **kwargs)

    return checked


@functools.wraps(generate_lorem_ipsum)
def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """jinja's lipsum, refused where its `n` paragraphs of up to `max` words may pass the size
    (lipsum(10 ** 8) ran for hours: made in Python, outside the template, out of any check)."""
    if isinstance(n, int) and isinstance(max, int):
        _rendering.bounds.check_size(n * max)
    return generate_lorem_ipsum(n, html, min, max)


def _sized(value):
    """A filter's or `~`'s result, its size checked (`[s, s]|join` doubles a text)."""
    if isinstance(value, str):
        _rendering.bounds.check_size(len(value))
    return value


class _Checked(NodeTransformer):
    """A template's tree with every loop's items taken through _paced, every filter's and `~`'s
    result through _sized."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = _filtered(node.iter, PACED)
        return node

    def visit_Filter(self, node: nodes.Filter) -> nodes.Expr:
        self.generic_visit(node)  # a filter block's filter (no node) is the block's, left as it is
        return node if node.node is None else _filtered(node, SIZED)

    def visit_Concat(self, node: nodes.Concat) -> nodes.Expr:
        return _filtered(self.generic_visit(node), SIZED)


def _filtered(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


def _check_binop(bounds: Bounds, operator: str, left, right) -> None:
    """Refuse `left operator right` before it is computed where its result would pass the
    bounds: a string or list repeated or joined past the output's size, an integer past
    MAX_INTEGER_BITS (one operation each: no check inside it could stop it)."""
    sized = (str, list, tuple)
    if operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        bounds.check_size(len(left) + len(right))
    elif operator == "*" and isinstance(left, sized) and isinstance(right, int):
        bounds.check_size(len(left) * right)
    elif operator == "*" and isinstance(right, sized) and isinstance(left, int):
        bounds.check_size(len(right) * left)
    elif operator == "*" and isinstance(left, int) and isinstance(right, int):
        bounds.check_integer(left.bit_length() + right.bit_length())
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        bounds.check_integer(right * left.bit_length())


@functools.lru_cache(maxsize=8)
def _bounded(source: str):
    """`source` compiled by BoundedEnvironment, without constant folding (which computes
    `{{ 9 ** 9 ** 9 }}` as the template compiles, out of any bound)."""
    # an empty template gives transformers' environment; the hostile one never compiles there
    environment = _transformers_compile("").environment.overlay()
    environment.__class__ = BoundedEnvironment
    environment.optimized = False
    filters = environment.filters
    padding = {name: _widths_checked(filters[name]) for name in ("center", "indent")}
    environment.filters = {**filters, **padding, PACED: _paced, SIZED: _sized}
    environment.globals = {**environment.globals, "lipsum": _lipsum}
    return environment.from_string(source)


def _compile(source: str):
    """transformers' compiled template, or in a thread rendering within bounds the bounded one."""
    bounds = getattr(_rendering, "bounds", None)
    if bounds is None:
        return _transformers_compile(source)
    bounds.check_source(len(source))
    return _bounded(source)


# render_jinja_template looks the compiler up on each call: streamer's renders get the bounded one
_transformers_compile = chat_template_utils._compile_jinja_template
chat_template_utils._compile_jinja_template = _compile
