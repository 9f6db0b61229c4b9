"""A chat template rendered within bounds: the model's template is code from its files, and one
that loops without end or makes a text of gigabytes (`{{ messages[0].content * 100000000 }}`)
rendered until the process was killed, holding serve's tokenizer (every request) meanwhile.

transformers compiles templates in jinja's immutable sandbox, which bounds range() but neither
time nor size. Where streamer renders, the same template is compiled by BoundedEnvironment: the
sandbox with transformers' own filters, globals and options (the same text out, byte for byte),
whose every loop step and call checks the render's deadline, whose string and integer operations
check their result's size before making it, and whose output is counted as it is joined (the
checks: template_checks.py). The bounds are the render's thread's: serve's handler threads, where
no signal reaches, are bounded as the main thread is.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from pathlib import Path

from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer
from transformers.utils import chat_template_utils

from .template_checks import (
    MAX_BYTES_PER_TOKEN,
    UNKNOWN_CONTEXT,
    Bounds,
    check_binop,
    check_call,
    lipsum,
    paced,
    printf_checked,
    rendering,
    sized,
    widths_checked,
)

RENDER_SECONDS = 10.0  # a long conversation renders in milliseconds


def render(tokenizer, context: int | None, *args, **kwargs):
    """`tokenizer.apply_chat_template(*args, **kwargs)`, its template rendered within RENDER_SECONDS
    and the text the model's `context` holds; TemplateBoundPassed past either."""
    rendering.bounds = Bounds(
        RENDER_SECONDS,
        time.monotonic() + RENDER_SECONDS,
        (context or UNKNOWN_CONTEXT) * MAX_BYTES_PER_TOKEN,
        context,
        template_file(tokenizer),
    )
    try:
        return tokenizer.apply_chat_template(*args, **kwargs)
    finally:
        rendering.bounds = None


def template_file(tokenizer) -> str:
    """The file the template comes from, as transformers reads it (chat_template.jinja first)."""
    folder = Path(getattr(tokenizer, "name_or_path", "") or ".")
    jinja = "chat_template.jinja"
    return jinja if (folder / jinja).is_file() else "chat_template in tokenizer_config.json"


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox with the render's bounds: made from its environment (overlay), so
    its filters, globals and whitespace options are those transformers renders with."""

    intercepted_binops = frozenset(("+", "*", "**", "%"))  # those whose result can explode

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _Checked().visit(super()._parse(source, name, filename))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        rendering.bounds.check_time()  # a macro's or a method's: recursion that fans out
        check_call(__obj, args, kwargs)
        return sized(super().call(__context, __obj, *args, **kwargs))  # s.replace: doubles s

    def call_filter(self, *args, **kwargs):
        """A filter map applies to each item: checked as a filter in the template is."""
        rendering.bounds.check_time()
        return sized(super().call_filter(*args, **kwargs))

    def call_binop(self, context, operator: str, left, right):
        check_binop(rendering.bounds, operator, left, right)
        return super().call_binop(context, operator, left, right)

    def concat(self, pieces: Iterable[str]) -> str:
        """Text joined (the output, a macro's, a set block's: the compiled code's `concat`),
        counted as it comes."""
        bounds, kept, size = rendering.bounds, [], 0
        for piece in pieces:
            size += len(piece)
            bounds.check_size(size)
            kept.append(piece)
        return "".join(kept)


# Filters no template can name (a name with a space): each a plain call in the compiled code,
# where a method of the environment would be a call through the sandbox
PACED, SIZED = "streamer paced", "streamer sized"


class _Checked(NodeTransformer):
    """A template's tree with every loop's items taken through paced, every filter's and `~`'s
    result through sized."""

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


@functools.lru_cache(maxsize=8)
def _bounded(source: str):
    """`source` compiled by BoundedEnvironment, without constant folding (which computes
    `{{ 10 ** (10 ** 10) }}` as the template compiles, out of any bound)."""
    # an empty template gives transformers' environment; the hostile one never compiles there
    environment = _transformers_compile("").environment.overlay()
    environment.__class__ = BoundedEnvironment  # an overlay is of its base's class
    environment.optimized = False
    filters = environment.filters
    # the filters a number makes long: a padding's width, batch's and slice's counts
    widths = {
        name: widths_checked(filters[name]) for name in ("center", "indent", "batch", "slice")
    }
    widths["format"] = printf_checked(filters["format"])
    environment.filters = {**filters, **widths, PACED: paced, SIZED: sized}
    environment.globals = {**environment.globals, "lipsum": lipsum}
    return environment.from_string(source)


def _compile(source: str):
    """transformers' compiled template, or in a thread rendering within bounds the bounded one."""
    bounds = getattr(rendering, "bounds", None)
    if bounds is None:
        return _transformers_compile(source)
    bounds.check_source(len(source))
    return _bounded(source)


# render_jinja_template looks the compiler up on each call: streamer's renders get the bounded one
_transformers_compile = chat_template_utils._compile_jinja_template
chat_template_utils._compile_jinja_template = _compile
