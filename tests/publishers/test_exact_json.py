"""publishers.exact_json without servers: every number exact, any depth, the
same value whichever of its three paths reads a text, and the values a
float64 would round kept as Decimal."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from publishers import exact_json
from publishers.exact_json import _exact, _iterative, at_risk, loads

PI = "3.141592653589793238462643383279"
PG_MAX_DEPTH = 13_099  # objects PostgreSQL 15 accepts at its default max_stack_depth (2MB), measured


def paths(text: str) -> list[Any]:
    """What each path reads ``text`` as: loads (whichever it picks), json.loads
    with the hooks, and the iterative parser."""
    return [loads(text), _exact(text), _iterative(text)]


def same(values: list[Any]) -> bool:
    """Equal, and of the same types (1.5 == Decimal("1.5"), but not for a reader)."""
    return len({exact_json.dumps(v) + repr(type(v)) for v in values}) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PI, Decimal(PI)),
        ("12345678901234567.89", Decimal("12345678901234567.89")),
        ("1e400", Decimal("1e400")),
        ("-1E+400", Decimal("-1e400")),
        ("1e-400", Decimal("1e-400")),
        ("0." + "0" * 400 + "1", Decimal("1e-401")),
        (str(2**53 + 1), 2**53 + 1),
        (str(2**64), 2**64),  # orjson reads it as a float
        (str(-(2**63) - 1), -(2**63) - 1),
        ("1" * 5000, Decimal("1" * 5000)),  # int(str) refuses over 4300 digits
        ("1.5", 1.5),
        ("0.1", 0.1),  # the float whose shortest spelling is 0.1: what every reader gives
        ("1e-05", 1e-05),
        ("5e-324", 5e-324),
        ("-0.0", -0.0),
    ],
)
def test_every_number_keeps_its_value_on_every_path(text: str, expected: Any) -> None:
    for document in (text, f'{{"v": {text}}}', f"[[{text}]]"):
        found = paths(document)
        assert same(found), found
    value = loads(text)
    assert type(value) is type(expected) and value == expected
    assert Decimal(exact_json.dumps(value)) == Decimal(text)


# Numbers as a database may write them: any digits, a fraction, an exponent.
numbers = st.builds(
    lambda sign, whole, fraction, exponent: sign + whole + fraction + exponent,
    st.sampled_from(["", "-"]),
    st.from_regex(r"0|[1-9][0-9]{0,40}", fullmatch=True),
    st.sampled_from([""]) | st.from_regex(r"\.[0-9]{1,40}", fullmatch=True),
    st.sampled_from([""]) | st.from_regex(r"[eE][-+]?[0-9]{1,4}", fullmatch=True),
)


@settings(max_examples=400, deadline=None)
@given(numbers)
def test_any_number_is_read_exactly_and_alike_on_every_path(text: str) -> None:
    found = paths(f"[{text}]")
    assert same(found), found
    [value] = found[0]
    if isinstance(value, float):  # only when the float's shortest spelling is the same number
        assert Decimal(repr(value)) == Decimal(text)
    else:
        assert Decimal(value) == Decimal(text)


@settings(max_examples=400, deadline=None)
@given(numbers)
def test_a_number_orjson_would_get_wrong_is_never_left_to_it(text: str) -> None:
    if at_risk(f'{{"v": {text}}}'.encode()):
        return
    read = orjson.loads(text)
    assert Decimal(repr(read) if isinstance(read, float) else read) == Decimal(text)
    assert same([read, loads(text)])


# Tokens as a message holds them: numbers of every kind, doubles as a source
# writes them (shortest spelling), 64-bit integers, and strings with digit runs
# and hex (a UUID's "8888e10578" looks like an exponent).
tokens = st.one_of(
    numbers,
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: orjson.dumps(f).decode()),
    st.integers(min_value=-(2**63), max_value=2**64 - 1).map(str),
    st.integers(min_value=2**63 - 2**10, max_value=2**65).map(lambda i: str(i) if i % 2 else str(-i)),
    st.from_regex(r'"[0-9a-f.eE+ -]{0,40}"', fullmatch=True),
)


@settings(max_examples=1000, deadline=None)
@given(st.lists(tokens, min_size=1, max_size=8), st.sampled_from([",", ", "]))
def test_a_text_is_left_to_orjson_only_when_it_reads_every_number_exactly(
    items: list[str], comma: str
) -> None:
    """``at_risk`` settles the usual runs inline (an integer of up to 18
    digits, a double's shortest spelling): whenever it says a text is safe,
    orjson reads every value of it as the exact path does, type and value."""
    text = "[" + comma.join(items) + "]"
    if at_risk(text.encode()):
        return
    fast, exact = orjson.loads(text), _exact(text)
    assert [(type(v), v) for v in fast] == [(type(v), v) for v in exact], text


def test_texts_without_numbers_at_risk_take_the_fast_path() -> None:
    """UUIDs (hex digits, 'e' before digits), timestamps and bigints within 64 bits."""
    message = (
        b'{"seq":1,"key":"3fa85e123-5717-4562-b3fc-2c963f66afa6","big":1152921504606846976,'
        b'"neg":-9223372036854775808,"ts":"2026-11-21T23:00:00.123456+00:00","f":0.125,"g":1.5e-7}'
    )
    assert not at_risk(message)
    assert at_risk(b'{"v":1e400}') and at_risk(b'{"v":[-2e-308]}') and at_risk(b'{"v":12345678.9012345678}')
    assert at_risk(b'{"v":"1.2.3.4.5.6.7.8.9"}')  # a run that is no number: the exact path says what it is


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_double_as_a_source_writes_it_takes_the_fast_path(value: float) -> None:
    """Its shortest spelling, often 17 digits (``1.5714285714285714``), is the
    float orjson reads: no need for the exact path, ten times slower."""
    text = orjson.dumps(value).decode()
    message = f'{{"ratio":{text},"big":9007199254740993}}'.encode()
    if "e" not in text.lower() or abs(int(text.lower().partition("e")[2])) < 100:
        assert not at_risk(message)
    assert same([loads(message), _exact(message.decode())])
    assert loads(message)["ratio"] == value
    assert at_risk(b'{"v":-9223372036854775809}') and at_risk(b'{"v":18446744073709551616}')


@pytest.mark.parametrize("depth", [300, 1000, 1025, 5000, PG_MAX_DEPTH])
def test_nesting_as_deep_as_postgresql_accepts(depth: int) -> None:
    text = '{"a": ' * depth + f"[{PI}]" + "}" * depth
    value = loads(text)
    for _ in range(depth):
        value = value["a"]
    assert value == [Decimal(PI)]
    assert exact_json.dumps(loads(text)) == text.replace(" ", "")
    copied = exact_json.copy(loads(text))
    assert exact_json.equal(copied, loads(text))


def test_an_integer_past_4300_digits_then_deep_nesting_is_read_not_a_recursion_error() -> None:
    """Both are valid jsonb: int(str) refuses the integer, and the retry must
    not then meet Python's recursion limit in the nesting after it."""
    big = "1" * 4301
    value = loads(f"[{big}," + "[" * 3000 + "]" * 3000 + "]")
    assert value[0] == Decimal(big)
    with pytest.raises(json.JSONDecodeError):
        loads(f"[{big}, NaN]")


@pytest.mark.parametrize(
    "text",
    ["", "[1,]", '{"a" 1}', "[1 2]", "[", '{"a":1}x', "NaN", "[Infinity]", "{,}", "[01]", "[" * 3000 + "1,]"],
)
def test_invalid_json_is_a_decode_error_on_every_path(text: str) -> None:
    for read in (loads, _exact, _iterative):
        with pytest.raises(json.JSONDecodeError):
            read(text)


def test_strings_and_escapes_are_read_as_json_reads_them() -> None:
    text = r'{"k\"ey": ["\u00e9t\u00e9", "\ud83d\ude00", "tab\there", "", "1e400"]}'
    assert _iterative(text) == json.loads(text) == loads(text)
    assert _iterative("[" * 2000 + '"\\u00e9"' + "]" * 2000) is not None


def test_equal_compares_numbers_by_value_but_not_booleans() -> None:
    assert exact_json.equal({"a": [1, 1.5]}, {"a": [Decimal("1.0"), Decimal("1.50")]})
    assert not exact_json.equal([True], [1])
    assert not exact_json.equal({"a": 1}, {"b": 1})
    assert not exact_json.equal([1, 2], [1])
    assert not exact_json.equal({"a": []}, {"a": {}})
