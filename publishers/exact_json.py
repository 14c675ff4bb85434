"""JSON text to Python values and back, keeping every value the mirror holds.

The mirror stores JSON columns as the database's own text (DESIGN.md §5): any
number of digits, ``1e400``, and nesting as deep as the database accepts
(PostgreSQL 15 with its default ``max_stack_depth`` of 2MB: 13,099 levels of
objects, 14,554 of arrays, measured). The usual Python parsers fall short of
that: orjson (3.13) reads every non-integer as a float64, integers beyond 64
bits too, refuses ``1e400`` and nesting beyond 1024 levels; ``json.loads``
stops at the interpreter's recursion limit (about 1000 levels).

``loads`` keeps everything:

- integers are ``int`` (``Decimal`` beyond Python's 4300-digit limit on
  ``int(str)``, which would refuse them);
- a non-integer is a ``float`` when the float's shortest spelling is the same
  number as the text (``1.5``, ``0.1``, ``1e-5``: what every JSON parser gives),
  else a ``Decimal`` with every digit (``3.141592653589793238462643383279``,
  ``12345678901234567.89``, ``1e400``, ``1e-400``): the same text gives the
  same type whichever path below reads it;
- any depth: past the C parsers' limits, an iterative parser reads it.

Three paths, fastest first: orjson when the text has no number a float64 or a
64-bit integer could get wrong (``at_risk``: long runs of digits, three-digit
exponents), ``json.loads`` with an exact number hook otherwise, and the
iterative parser beyond its recursion limit.

``dumps`` writes such values back as JSON text (a ``Decimal`` as its digits),
``copy`` copies one, and ``equal`` compares two, all iteratively: Python's own
``copy.deepcopy``, ``==`` and ``json.dumps`` recurse and fail on deep values.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import orjson

# Which numbers orjson (3.13) reads exactly: integers within [-2**63, 2**64),
# and a decimal of at most 15 significant digits whose exponent is within
# +-307 (DBL_DIG: such a decimal reads back as written). So a number token
# whose run of digits and dots is under 16 characters, with an exponent of at
# most two digits, is safe; a text with none other is read by orjson. Found
# on the text's "shape" (digits and dots as 0, e/E as e, signs as -, the rest
# as blanks: bytes.translate and bytes.find run in C; a regular expression
# over the text took 10-40 us a message, more than orjson's decoding). A
# number inside a string may look at risk: the exact path then reads it, slower.
_SHAPE = bytes(
    ord("0") if c in b"0123456789." else ord("e") if c in b"eE" else ord("-") if c in b"+-" else ord(" ")
    for c in range(256)
)
_LONG = b"0" * 16
_RUN = re.compile(rb"0+")
_EXPONENT = re.compile(rb"[eE][-+]?[0-9]+")
_EXPONENTS = (b"e000", b"e-000")  # an exponent of three digits or more
_EXPONENT_SHAPE = re.compile(rb"e-?000")  # either (one search: half the time of two finds)
_BEFORE_NUMBER = frozenset(b":,[ \t\n\r")  # what precedes a number token in JSON (or its sign)
_NUMBER_CHARS = frozenset(b"0123456789.")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
# json's string scanner (C): (text, index after the opening quote, strict) ->
# (the string, index after the closing quote); not in typeshed's stubs
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_INT_DIGITS = 4300  # CPython's default int_max_str_digits: int(text) refuses longer


def loads(text: bytes | str) -> Any:
    """The value of a JSON text, every number exact, at any depth.

    Raises ``json.JSONDecodeError`` (orjson's is a subclass) on invalid JSON."""
    raw = text.encode() if isinstance(text, str) else text
    if not at_risk(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # deeper than 1024 levels, or not JSON: the exact path says which
    return _exact(raw.decode("utf-8") if isinstance(raw, bytes) else raw)


def at_risk(raw: bytes) -> bool:
    """Whether ``raw`` may hold a number orjson would read wrongly.

    Every change message of a row with a double or a bigint has a run of 16
    or more digits, so the usual runs are settled inline, in as few Python
    steps as can be: an integer of at most 18 digits (below 2**63), and a
    fraction that is its float's shortest spelling, as a source writes a
    double. Measured on the subscriber benchmark's messages (ten columns, a
    double and a bigint among them): 5.6 -> 3.6 us a message (orjson's
    decoding: 2.5 us), most of it the float's ``repr`` (0.8 us), which
    nothing cheaper can stand for."""
    shape = raw.translate(_SHAPE)
    start = shape.find(_LONG)
    while start != -1:
        end = _RUN.match(shape, start).end()  # type: ignore[union-attr]  # shape[start] is "0"
        token = raw[start:end]
        if raw[end : end + 1] in _E or (len(token) > 18 and b"." not in token):
            if not _orjson_reads(raw, start, end):  # an exponent, or 19 digits and more
                return True
        elif b"." in token and not (_shortest(token) or _float_is_exact(token)):
            return True
        start = shape.find(_LONG, end)
    return _EXPONENT_SHAPE.search(shape) is not None and _long_exponent(raw, shape)


def _shortest(token: bytes) -> bool:
    """Whether ``token`` is its float's shortest spelling (then orjson reads it exactly)."""
    try:
        return repr(float(token)).encode() == token
    except ValueError:  # "1.2.3" in a string: no number
        return False


_E = (b"e", b"E")


def _orjson_reads(raw: bytes, start: int, end: int) -> bool:
    """Whether the run raw[start:end] of 16 or more digits and dots is a number
    orjson reads as ``loads`` must: an integer it keeps exactly (a 64-bit one),
    or a fraction whose float is that number (``_float_is_exact``)."""
    token = raw[start:end]
    if raw[end : end + 1] in (b"e", b"E"):
        exponent = _EXPONENT.match(raw, end)
        return exponent is not None and _float_is_exact(raw[start : exponent.end()])
    if b"." in token:
        return _float_is_exact(token)
    if len(token) > 20:
        return False
    if len(token) < 19:
        return True
    negative = raw[start - 1 : start] == b"-"
    return int(token) <= 2**63 if negative else int(token) < 2**64


def _float_is_exact(token: bytes) -> bool:
    """Whether a fraction's float is the number its text says (``real`` would
    return the float): then orjson, whose parsing is correctly rounded like
    ``float()``'s (checked on 600,000 random doubles and 16-25 digit
    decimals), returns the value the exact path would. Every double a source
    writes is its shortest spelling, often 17 significant digits
    (``1.5714285714285714``): without this, each message holding one took
    the exact path, ten times slower (measured: 20 us against 2 us a message
    of the drain benchmark's rows). A run that is no number (``1.2.3`` in a
    string) is left to the exact path."""
    text = token.decode("ascii")
    try:
        value = float(text)
    except ValueError:
        return False
    # real()'s first test, inline: a source writes a double as its shortest
    # spelling, which is repr's, so this settles nearly every such run
    return repr(value) == text or isinstance(real(text), float)


def _long_exponent(raw: bytes, shape: bytes) -> bool:
    for pattern in _EXPONENTS:
        at = shape.find(pattern)
        while at != -1:
            if _mantissa_before(raw, at):
                return True
            at = shape.find(pattern, at + 1)
    return False


def _mantissa_before(raw: bytes, at: int) -> bool:
    """Whether the ``e`` at ``at`` ends a number token's mantissa (not, say, a
    hex digit of a UUID, which no JSON delimiter precedes)."""
    start = at
    while start > 0 and raw[start - 1] in _NUMBER_CHARS:
        start -= 1
    if start == at:
        return False
    if raw[start - 1 : start] == b"-":
        start -= 1
    return start == 0 or raw[start - 1] in _BEFORE_NUMBER


def _exact(text: str) -> Any:
    try:
        return json.loads(text, parse_float=real, parse_constant=_no_constant)
    except RecursionError:
        return _iterative(text)
    except _NotJson as exc:
        raise json.JSONDecodeError(str(exc), text, text.find(exc.args[0].split()[0])) from None
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise
        # int(str) refused an integer of over 4300 digits: the iterative reader, which
        # reads every integer with ``integer`` and has no recursion limit (a retry
        # through json.loads with parse_int could still meet deep nesting further on)
        return _iterative(text)


def real(text: str) -> float | Decimal:
    """A JSON number with a fraction or exponent: the float when its shortest
    spelling is the same number, else every digit as a Decimal."""
    value = float(text)
    if repr(value) == text or (math.isfinite(value) and Decimal(repr(value)) == Decimal(text)):
        return value
    return Decimal(text)


def integer(text: str) -> int | Decimal:
    """A JSON integer: an int, or a Decimal beyond int(str)'s 4300-digit limit."""
    digits = len(text) - text.startswith("-")
    return int(text) if digits <= _INT_DIGITS else Decimal(text)


class _NotJson(ValueError):
    pass


def _no_constant(text: str) -> Any:
    raise _NotJson(f"{text} is not JSON")  # json.loads would accept NaN and Infinity


# -- the iterative parser -------------------------------------------------------


class _Open:
    """An array or object being read, and (for an object) the member's name."""

    __slots__ = ("container", "name")

    def __init__(self, container: list[Any] | dict[str, Any]) -> None:
        self.container = container
        self.name = ""


def _iterative(text: str) -> Any:
    """``text`` read with an explicit stack instead of recursion: any depth."""
    stack: list[_Open] = []
    pos = _skip(text, 0)
    while True:
        value, pos = _value(text, pos, stack)
        if value is _OPENED:
            continue
        while True:  # the value ends what it belongs to, or a comma follows it
            if not stack:
                if _skip(text, pos) != len(text):
                    raise json.JSONDecodeError("Extra data", text, pos)
                return value
            top = stack[-1]
            if isinstance(top.container, list):
                top.container.append(value)
            else:
                top.container[top.name] = value
            pos, closed = _after_member(text, pos, top)
            if not closed:
                break
            value = stack.pop().container


_OPENED = object()  # _value's answer when it opened an array or object


def _value(text: str, pos: int, stack: list[_Open]) -> tuple[Any, int]:
    """The scalar or empty container at ``pos``, or ``_OPENED`` after pushing a
    container whose first member comes next; and the position after it."""
    char = text[pos : pos + 1]
    if char in ("[", "{"):
        close = "]" if char == "[" else "}"
        after = _skip(text, pos + 1)
        if text[after : after + 1] == close:
            return ([] if char == "[" else {}), after + 1
        opened = _Open([] if char == "[" else {})
        stack.append(opened)
        if char == "{":
            return _OPENED, _member_name(text, after, opened)
        return _OPENED, after
    if char == '"':
        return _scanstring(text, pos + 1, True)
    number = _NUMBER.match(text, pos)
    if number is not None:
        found = number.group()
        value = real(found) if number.group(1) or number.group(2) else integer(found)
        return value, _skip(text, number.end())
    for literal, constant in (("true", True), ("false", False), ("null", None)):
        if text.startswith(literal, pos):
            return constant, _skip(text, pos + len(literal))
    raise json.JSONDecodeError("Expecting value", text, pos)


def _member_name(text: str, pos: int, opened: _Open) -> int:
    """Read ``"name":`` at ``pos`` into ``opened``; the position of its value."""
    if text[pos : pos + 1] != '"':
        raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, pos)
    opened.name, pos = _scanstring(text, pos + 1, True)
    pos = _skip(text, pos)
    if text[pos : pos + 1] != ":":
        raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
    return _skip(text, pos + 1)


def _after_member(text: str, pos: int, top: _Open) -> tuple[int, bool]:
    """Past the ``,`` (and the next name) or the closing bracket after a member;
    whether the container closed."""
    pos = _skip(text, pos)
    char = text[pos : pos + 1]
    close = "]" if isinstance(top.container, list) else "}"
    if char == close:
        return _skip(text, pos + 1), True
    if char != ",":
        raise json.JSONDecodeError(f"Expecting ',' delimiter or '{close}'", text, pos)
    pos = _skip(text, pos + 1)
    if isinstance(top.container, dict):
        pos = _member_name(text, pos, top)
    return pos, False


def _skip(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    return pos if match is None else match.end()


# -- writing, copying, comparing ------------------------------------------------


def dumps(value: Any) -> str:
    """The compact JSON text of a value ``loads`` returns, every digit kept
    (a Decimal is written as its digits), at any depth."""
    return "".join(_pieces(value))


class _Writing:
    """An array or object being written: its members still to write."""

    __slots__ = ("members", "close", "first")

    def __init__(self, value: dict[str, Any] | list[Any]) -> None:
        self.members: Iterator[Any] = iter(value.items() if isinstance(value, dict) else value)
        self.close = "}" if isinstance(value, dict) else "]"
        self.first = True


def _pieces(value: Any) -> Iterator[str]:
    stack: list[_Writing] = []
    while True:
        if isinstance(value, dict | list):
            yield "{" if isinstance(value, dict) else "["
            stack.append(_Writing(value))
        else:
            yield _scalar(value)
        while stack:  # the next member to write, closing what has none left
            top = stack[-1]
            item: Any = next(top.members, _END)
            if item is _END:
                yield stack.pop().close
                continue
            if not top.first:
                yield ","
            top.first = False
            if top.close == "}":
                yield orjson.dumps(_name(item[0])).decode() + ":"
                value = item[1]
            else:
                value = item
            break
        else:
            return


_END = object()


def _name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"a JSON object's member names are strings, not {type(name).__name__}")
    return name


def _scalar(value: Any) -> str:
    if value is None or isinstance(value, bool | str):
        return orjson.dumps(value).decode()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float | Decimal):
        if not value.is_finite() if isinstance(value, Decimal) else not math.isfinite(value):
            raise ValueError(f"{value} is not a JSON number")
        return repr(value) if isinstance(value, float) else str(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def copy(value: Any) -> Any:
    """A deep copy of a JSON value, at any depth (``copy.deepcopy`` recurses)."""
    if not isinstance(value, dict | list):
        return value  # scalars are immutable
    root: dict[str, Any] | list[Any] = {} if isinstance(value, dict) else []
    work: list[tuple[Any, Any]] = [(value, root)]
    while work:
        source, target = work.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for name, item in items:
            made = ({} if isinstance(item, dict) else []) if isinstance(item, dict | list) else item
            if isinstance(target, dict):
                target[name] = made
            else:
                target.append(made)
            if made is not item:
                work.append((item, made))
    return root


def equal(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal (RFC 6902 ``test``), at any depth;
    numbers by value (``1 == 1.0 == Decimal("1.0")``), never ``True == 1``."""
    work = [(a, b)]
    while work:
        x, y = work.pop()
        if isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            work += [(x[k], y[k]) for k in x]
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                return False
            work += list(zip(x, y, strict=True))
        elif isinstance(x, dict | list) or isinstance(y, dict | list):
            return False
        elif isinstance(x, bool) != isinstance(y, bool) or x != y:
            return False
    return True
