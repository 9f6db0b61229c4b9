"""What a chat template rendered within bounds (template_bounds.py) checks as it renders: the
render's bounds, this thread's, and the checks of loops, calls, operators and filters against
them. Each check is a comparison; a text or an integer is checked before it is made where its
size is known before (a repetition, a padding's width), after where not (a filter's result).
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from jinja2.utils import generate_lorem_ipsum

from ..arguments import tokens_text
from ..errors import StreamerError

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
    """One render's: its deadline and seconds, the characters the prompt may have (the model's
    `context` at MAX_BYTES_PER_TOKEN), its template's file."""

    seconds: float
    deadline: float
    most: int
    context: int | None
    template: str

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateBoundPassed(
                f"the model's chat template ({self.template}) did not finish rendering the prompt "
                f"in {self.seconds:g} s (a loop without end?): fix the template."
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


rendering = threading.local()  # .bounds: this thread's render's, None between renders
PADDING = ("center", "ljust", "rjust", "zfill", "expandtabs")  # str's methods a width makes long
# A %-format's conversions, with the width and precision each gives (digits, or * for a value's)
PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
# A str.format field's spec (after its colon), nested fields and all
FORMAT_SPEC = re.compile(r"\{[^{}:]*:((?:[^{}]|\{[^{}]*\})*)\}")


def paced(items: Iterable) -> Iterator:
    """A loop's items, the deadline checked before each (a loop over a list runs no call)."""
    bounds = rendering.bounds
    for item in items:
        bounds.check_time()
        yield item


def check_widths(args: tuple, kwargs: dict) -> None:
    """A padding's width (or a count) checked before the text is made (`s.center(10**11)` is
    100 GB; `[1]|batch(10**9, 0)` a list of 10**9)."""
    for width in (*args, *kwargs.values()):
        if isinstance(width, int):
            rendering.bounds.check_size(width)


def check_call(function: Callable, args: tuple, kwargs: dict) -> None:
    """A str method's widths checked before its text is made: a padding's, a format's."""
    method = getattr(function, "__wrapped__", function)  # jinja's sandbox wraps str.format
    text = getattr(method, "__self__", None)
    if isinstance(text, str) and method.__name__ in PADDING:
        check_widths(args, kwargs)
    elif isinstance(text, str) and method.__name__ in ("format", "format_map"):
        check_format(text, args, kwargs)


def check_printf(text: str, values) -> None:
    """A %-format's widths and precisions checked before the text is made (`'%0*d' % (10**13, 1)`,
    `'%.9999999999f' % 1`)."""
    for conversion in PRINTF.finditer(text):
        for number in conversion.groups():
            if number == "*":  # taken from the values
                check_widths(values if isinstance(values, tuple) else (values,), {})
            elif number:
                _check_number(number)


def check_format(text: str, args: tuple, kwargs: dict) -> None:
    """str.format's widths and precisions checked before the text is made (`'{:>9999999999}'`)."""
    for spec in FORMAT_SPEC.findall(text):
        for number in re.findall(r"\d+", spec):
            _check_number(number)
        if "{" in spec:  # a nested field: a width taken from the values (format_map's too)
            mapped = {k: v for a in args if isinstance(a, dict) for k, v in a.items()}
            check_widths(args, {**kwargs, **mapped})


def _check_number(digits: str) -> None:
    # 18 digits are over any bound already (and int() takes no more than 4300)
    rendering.bounds.check_size(int(digits[:18]))


def widths_checked(pad: Callable) -> Callable:
    """A filter a number makes long (center's width, batch's count) that checks it first."""

    @functools.wraps(pad)
    def checked(value, *args, **kwargs):
        check_widths(args, kwargs)
        return pad(value, *args, **kwargs)

    return checked


def printf_checked(format_filter: Callable) -> Callable:
    """The format filter (`'%5s'|format(x)`, a %-format) that checks its widths first."""

    @functools.wraps(format_filter)
    def checked(value, *args, **kwargs):
        check_printf(str(value), args)
        return format_filter(value, *args, **kwargs)

    return checked


@functools.wraps(generate_lorem_ipsum)
def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """jinja's lipsum, refused where its `n` paragraphs of up to `max` words may pass the size
    (lipsum(10 ** 8) ran for hours: made in Python, outside the template, out of any check)."""
    if isinstance(n, int) and isinstance(max, int):
        rendering.bounds.check_size(n * max)
    return generate_lorem_ipsum(n, html, min, max)


def sized(value):
    """A filter's or `~`'s result, its size checked (`[s, s]|join` doubles a text)."""
    if isinstance(value, str):
        rendering.bounds.check_size(len(value))
    return value


def check_binop(bounds: Bounds, operator: str, left, right) -> None:
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
    elif operator == "%" and isinstance(left, str):
        check_printf(left, right)
