"""Column values to JSON text (DESIGN.md §5): what a subscriber reads for each
source type, exact where the source is exact, and a PoisonChange naming the
column where JSON has no spelling for the value."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import tracemalloc
import uuid
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.config import TableConfig
from cdc.errors import PoisonChange
from cdc.mapping import TableMapper
from cdc.sources.base import Column, TableInfo
from cdc.templates import Template
from cdc.values import RawJson, Unreadable, _default, _plain, encode_row, encode_value, iso_duration


def decoded(value: Any) -> Any:
    return json.loads(encode_value(value, "Value"))


# -- numbers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, b"0"),
        (-42, b"-42"),
        (2**31, b"2147483648"),
        (2**53 + 1, b"9007199254740993"),  # a bigint a double would round to ...992
        (2**63 - 1, b"9223372036854775807"),  # bigint max
        (-(2**63), b"-9223372036854775808"),  # bigint min
        (2**64, b"18446744073709551616"),  # numeric(38,0) read as int, or a big JSON number
        (-(10**30), b"-1000000000000000000000000000000"),
        (True, b"true"),
        (False, b"false"),
    ],
)
def test_integers_are_exact_json_numbers(value: int, text: bytes) -> None:
    assert encode_value(value, "Quantity") == text
    assert json.loads(text) == value and type(json.loads(text)) is type(value)


@pytest.mark.parametrize(
    ("value", "text"),
    [(12.5, b"12.5"), (0.1, b"0.1"), (-0.0, b"-0.0"), (1e300, b"1e+300"), (5e-324, b"5e-324"), (3.0, b"3.0")],
)
def test_floats_are_json_numbers(value: float, text: bytes) -> None:
    assert encode_value(value, "Price") == text


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_poison_naming_the_column(value: float) -> None:
    with pytest.raises(PoisonChange, match=rf"^column Price: {value} cannot be represented in JSON$"):
        encode_value(value, "Price")


def test_nan_inside_a_json_column_is_poison_too() -> None:
    with pytest.raises(PoisonChange, match=r"^column Payload: nan cannot be represented in JSON$"):
        encode_value({"readings": [1.5, float("nan")]}, "Payload")


# -- decimals: strings, lossless -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12.50", "12.50"),  # money(19,4)/numeric(10,2): the trailing zero is the column's scale
        ("0.000", "0.000"),
        ("-0", "-0"),
        ("100", "100"),
        ("1E+3", "1000"),  # fixed-point: no exponent ever reaches a consumer
        ("1.0E-10", "0.00000000010"),
        ("1E-7", "0.0000001"),  # Decimal("0.0000001") reads back as 1E-7; written as the database shows it
        (
            "12345678901234567890123456789.123456789",
            "12345678901234567890123456789.123456789",
        ),  # decimal(38,9)
        (
            "-99999999999999999999999999999999999999",
            "-99999999999999999999999999999999999999",
        ),  # decimal(38,0)
    ],
)
def test_decimals_are_fixed_point_strings_with_every_digit(text: str, expected: str) -> None:
    assert encode_value(Decimal(text), "Amount") == f'"{expected}"'.encode()
    back = Decimal(json.loads(encode_value(Decimal(text), "Amount")))
    assert back == Decimal(text)
    if Decimal(text).as_tuple().exponent <= 0:  # type: ignore[operator]
        assert back.as_tuple() == Decimal(text).as_tuple()  # same digits and scale


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NaN", b'"NaN"'),
        ("-NaN", b'"NaN"'),
        ("sNaN", b'"NaN"'),
        ("Infinity", b'"Infinity"'),
        ("-Infinity", b'"-Infinity"'),
    ],
)
def test_decimal_nan_and_infinity_are_the_strings_postgresql_spells_them(text: str, expected: bytes) -> None:
    # numeric has them (PostgreSQL 14+ for the infinities), and a decimal is a string anyway
    assert encode_value(Decimal(text), "Amount") == expected
    assert encode_value([Decimal("1.10"), Decimal(text)], "Rates") == b'["1.10",%b]' % expected


def test_decimals_inside_arrays_are_strings() -> None:
    # a PostgreSQL numeric[] column
    assert encode_value([Decimal("1.10"), Decimal("2")], "Rates") == b'["1.10","2"]'


@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_decimal_round_trip_is_exact(value: Decimal) -> None:
    back = Decimal(json.loads(encode_value(value, "Amount")))
    assert back == value
    assert back.as_tuple() == value.as_tuple()  # scale and sign of zero too


@given(st.integers())
def test_integer_round_trip_is_exact(value: int) -> None:
    assert json.loads(encode_value(value, "Id")) == value


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float_round_trip_is_exact(value: float) -> None:
    back = json.loads(encode_value(value, "Price"))
    assert back == value and str(back) == str(value)


# -- dates and times: ISO 8601 ------------------------------------------------------------

CET = dt.timezone(dt.timedelta(hours=1))
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (dt.date(2026, 11, 21), "2026-11-21"),
        (dt.date(1, 1, 1), "0001-01-01"),
        (dt.time(8, 30), "08:30:00"),
        (dt.time(23, 59, 59, 999999), "23:59:59.999999"),
        (dt.time(8, 30, 0, 10000), "08:30:00.010000"),  # orjson 3.13 alone writes 08:30:00.10000
        (dt.time(8, 30, tzinfo=CET), "08:30:00+01:00"),  # PostgreSQL timetz
        (dt.time(8, 30, 0, 500, tzinfo=dt.UTC), "08:30:00.000500+00:00"),
        (dt.datetime(2026, 11, 21, 23, 0), "2026-11-21T23:00:00"),  # datetime2 / timestamp
        (dt.datetime(2026, 11, 21, 23, 0, 0, 123456), "2026-11-21T23:00:00.123456"),
        (dt.datetime(2026, 11, 21, 23, 0, 0, 123456, tzinfo=dt.UTC), "2026-11-21T23:00:00.123456+00:00"),
        (dt.datetime(2026, 11, 21, 23, 0, tzinfo=IST), "2026-11-21T23:00:00+05:30"),  # datetimeoffset
        (dt.datetime(2026, 7, 1, 12, 0, tzinfo=ZoneInfo("Europe/Amsterdam")), "2026-07-01T12:00:00+02:00"),
        (dt.datetime(2026, 1, 1, 12, 0, tzinfo=ZoneInfo("Europe/Amsterdam")), "2026-01-01T12:00:00+01:00"),
    ],
)
def test_dates_and_times_are_iso_8601(value: dt.date | dt.time, text: str) -> None:
    assert decoded(value) == text
    parse = dt.time.fromisoformat if isinstance(value, dt.time) else type(value).fromisoformat
    assert parse(text) == value


def test_an_offset_with_seconds_is_written_in_utc() -> None:
    # Amsterdam's local mean time until 1937 was +00:19:32: an ISO 8601 offset
    # has no seconds, and cutting them would move the instant.
    value = dt.datetime(1920, 1, 15, 12, 0, tzinfo=ZoneInfo("Europe/Amsterdam"))
    assert value.utcoffset() == dt.timedelta(minutes=19, seconds=32)
    assert decoded(value) == "1920-01-15T11:40:28+00:00"
    assert dt.datetime.fromisoformat(decoded(value)) == value


@given(st.datetimes())
def test_naive_datetimes_round_trip(value: dt.datetime) -> None:
    assert dt.datetime.fromisoformat(decoded(value)) == value


offsets = st.timedeltas(
    min_value=dt.timedelta(hours=-23, minutes=-59), max_value=dt.timedelta(hours=23, minutes=59)
)


@given(st.datetimes(min_value=dt.datetime(2, 1, 1), max_value=dt.datetime(9998, 12, 31)), offsets)
def test_aware_datetimes_keep_the_instant(naive: dt.datetime, offset: dt.timedelta) -> None:
    value = naive.replace(tzinfo=dt.timezone(offset))
    back = dt.datetime.fromisoformat(decoded(value))
    assert back == value
    if not offset % dt.timedelta(minutes=1):
        assert back.utcoffset() == offset  # the offset is kept when ISO 8601 can spell it


@given(st.times(timezones=st.none() | st.builds(dt.timezone, offsets)))
def test_times_round_trip(value: dt.time) -> None:
    back = dt.time.fromisoformat(decoded(value))
    assert back == value and back.utcoffset() == value.utcoffset()


# -- intervals: ISO 8601 durations ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (dt.timedelta(0), "PT0S"),
        (dt.timedelta(days=1), "P1D"),
        (dt.timedelta(days=1, seconds=1), "P1DT1S"),
        (dt.timedelta(hours=2, minutes=3, seconds=4.5), "PT2H3M4.5S"),
        (dt.timedelta(minutes=90), "PT1H30M"),
        (dt.timedelta(seconds=59, microseconds=123456), "PT59.123456S"),
        (dt.timedelta(microseconds=1), "PT0.000001S"),
        (dt.timedelta(days=400, hours=1), "P400DT1H"),
        (dt.timedelta(seconds=-1), "-PT1S"),
        (dt.timedelta(days=-1, hours=2), "-PT22H"),
        (dt.timedelta(days=-3, microseconds=-250000), "-P3DT0.25S"),
    ],
)
def test_intervals_are_iso_8601_durations(value: dt.timedelta, text: str) -> None:
    assert iso_duration(value) == text
    assert decoded(value) == text


_DURATION = re.compile(r"(-?)P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)(?:\.(\d{1,6}))?S)?)?")


def _parse_duration(text: str) -> dt.timedelta:
    match = _DURATION.fullmatch(text)
    assert match, text
    sign, days, hours, minutes, seconds, fraction = match.groups()
    value = dt.timedelta(
        days=int(days or 0),
        hours=int(hours or 0),
        minutes=int(minutes or 0),
        seconds=int(seconds or 0),
        microseconds=int((fraction or "0").ljust(6, "0")),
    )
    return -value if sign else value


@given(st.timedeltas())
def test_intervals_round_trip_to_the_microsecond(value: dt.timedelta) -> None:
    assert _parse_duration(decoded(value)) == value


# -- binary, UUID, strings, null ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (b"", ""),
        (b"\x00\xff\x10cdc", "AP8QY2Rj"),
        (bytearray(b"\xde\xad\xbe\xef"), "3q2+7w=="),  # varbinary via pyodbc
        (memoryview(b"\xde\xad\xbe\xef"), "3q2+7w=="),  # bytea via older drivers
    ],
)
def test_binary_is_base64(value: bytes | bytearray | memoryview, text: str) -> None:
    assert decoded(value) == text


@given(st.binary())
def test_binary_round_trips(value: bytes) -> None:
    assert base64.b64decode(decoded(value), validate=True) == value


def test_uuids_are_lowercase_strings() -> None:
    # SQL Server hands out uniqueidentifier in upper case
    value = uuid.UUID("9F1C6E2A-3B4D-4C5E-8F60-7A1B2C3D4E5F")
    assert encode_value(value, "RowGuid") == b'"9f1c6e2a-3b4d-4c5e-8f60-7a1b2c3d4e5f"'


@pytest.mark.parametrize(
    "value", ["", "Müller", "日本語", "🎉 emoji", 'quote " and \\ backslash', "line\nbreak\ttab", "\x00"]
)
def test_strings_are_json_strings(value: str) -> None:
    assert decoded(value) == value


def test_strings_are_written_as_utf8_not_escapes() -> None:
    assert encode_value("Grüße", "Name") == '"Grüße"'.encode()


@given(st.text())
def test_strings_round_trip(value: str) -> None:
    assert decoded(value) == value


@pytest.mark.parametrize("value", ["\ud800", "abc\udfffdef", ["ok", "\udc80"], {"k": "\ud83d"}])
def test_lone_surrogates_are_poison_naming_the_column(value: Any) -> None:
    # nvarchar is UTF-16 in SQL Server: half a pair can be stored, but has no UTF-8 spelling
    with pytest.raises(PoisonChange, match=r"^column Comment: value cannot be encoded as JSON: .*surrogates"):
        encode_value(value, "Comment")


def test_null_is_json_null() -> None:
    assert encode_value(None, "ValidTo") == b"null"


# -- JSON columns and arrays ---------------------------------------------------------------


def test_json_columns_are_nested_values() -> None:
    value = {
        "sku": "A-100",
        "tags": ["red", "sale"],
        "price": Decimal("19.90"),
        "stock": {"eu": 12, "us": None},
        "ratio": 0.25,
        "ids": (uuid.UUID("00000000-0000-0000-0000-00000000002A"),),
        "thumb": b"\x89PNG",
        "seen": dt.datetime(2026, 11, 21, 23, 0, tzinfo=dt.UTC),
        "big": 2**70,
    }
    assert decoded(value) == {
        "sku": "A-100",
        "tags": ["red", "sale"],
        "price": "19.90",
        "stock": {"eu": 12, "us": None},
        "ratio": 0.25,
        "ids": ["00000000-0000-0000-0000-00000000002a"],
        "thumb": "iVBORw==",
        "seen": "2026-11-21T23:00:00+00:00",
        "big": 2**70,
    }


def test_non_string_keys_become_strings() -> None:
    assert decoded({1: "a", 2: "b"}) == {"1": "a", "2": "b"}


def test_an_unsupported_type_is_poison_naming_the_column() -> None:
    with pytest.raises(PoisonChange, match=r"^column Flags: value cannot be encoded as JSON: .*set"):
        encode_value({"admin", "ops"}, "Flags")


def test_an_absurdly_long_integer_is_poison_not_a_crash() -> None:
    with pytest.raises(PoisonChange, match=r"^column Payload: value cannot be encoded as JSON"):
        encode_value(10**5000, "Payload")


# -- JSON text from the source, and values it could not load -------------------------------

EXACT_JSON = [
    b'{"pi": 3.141592653589793238462643383279}',  # more digits than a double holds
    b'{"d": 12345678901234567.89, "big": 123456789012345678901234567890}',
    b"1e400",  # beyond a double: a float would read inf
    b"[-0.0, 1E-400, 5e-324]",
    b'  {"a" :\n  [1,2] }  ',  # json keeps the text as written: whitespace too
    rb'"\ud83c\udf89 \u0000 \"x\""',  # escapes stay escapes
    b'{"a": 1, "a": 2}',  # json keeps duplicate keys
    b"[" * 1000 + b"]" * 1000,  # deeper than the parsers' recursion limits
]


@pytest.mark.parametrize("text", EXACT_JSON)
def test_raw_json_is_its_text_byte_for_byte(text: bytes) -> None:
    assert encode_value(RawJson(text), "Doc") == text
    assert encode_row({"Doc": RawJson(text)}) == {"Doc": text}
    assert _MAPPER.encode({"Id": 1, "Value": RawJson(text), "Other": None}, {"Id": 1})["Value"] == text


def test_raw_json_inside_an_array_is_spliced_too() -> None:
    # a json[] / jsonb[] column
    deep = b"[" * 1000 + b"]" * 1000
    value = [RawJson(b'{"pi": 3.141592653589793238462643383279}'), None, RawJson(b"1e400"), RawJson(deep)]
    expected = b'[{"pi": 3.141592653589793238462643383279},null,1e400,%b]' % deep
    assert encode_value(value, "Docs") == expected
    assert encode_value([[RawJson(b"1")], [RawJson(b"2")]], "Docs") == b"[[1],[2]]"


def test_raw_json_reads_as_its_text_and_compares_by_it() -> None:
    assert str(RawJson('{"k": "é"}'.encode())) == '{"k": "é"}'
    assert RawJson(b"[1]") == RawJson(b"[1]") != RawJson(b"[1.0]")
    assert len({RawJson(b"1"), RawJson(b"1")}) == 1


def test_an_unreadable_value_is_poison_naming_the_column_with_its_reason() -> None:
    reason = "time value '25:00:00' cannot be read: hour must be in 0..23"
    with pytest.raises(PoisonChange, match=rf"^column Opens: {re.escape(reason)}$"):
        encode_value(Unreadable(reason), "Opens")
    with pytest.raises(PoisonChange, match=rf"^column Opens: {re.escape(reason)}$"):
        encode_value([dt.time(8), Unreadable(reason)], "Opens")  # an array's element
    with pytest.raises(PoisonChange, match=rf"^column Other: {re.escape(reason)}$"):
        _MAPPER.encode({"Id": 1, "Value": None, "Other": Unreadable(reason)}, {"Id": 1})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_json_column_values_round_trip(value: Any) -> None:
    assert decoded(value) == value


def test_encode_row_keeps_the_column_order_and_names() -> None:
    row = {"Id": 42, "Price": Decimal("12.50"), "ValidFrom": dt.date(2026, 11, 21), "Status": None}
    assert encode_row(row) == {
        "Id": b"42",
        "Price": b'"12.50"',
        "ValidFrom": b'"2026-11-21"',
        "Status": b"null",
    }
    assert list(encode_row(row)) == ["Id", "Price", "ValidFrom", "Status"]
    with pytest.raises(PoisonChange, match=r"^column Price: nan"):
        encode_row({"Id": 42, "Price": float("nan")})


def _general(value: Any) -> bytes:
    """The general path alone, which the per-type shortcuts must agree with."""
    return orjson.dumps(_plain(value, "Value"), default=_default)


shortcut_values = st.one_of(
    json_values,
    st.builds(RawJson, st.sampled_from(EXACT_JSON)),
    st.lists(st.builds(RawJson, st.sampled_from(EXACT_JSON[:4])) | st.none(), max_size=3),
    st.decimals(),
    st.uuids(),
    st.dates(),
    st.datetimes(),
    st.datetimes(timezones=st.timezones()),
    st.lists(st.one_of(st.decimals(), st.datetimes(), st.times(), st.integers(), st.text()), max_size=4),
    st.dictionaries(st.integers() | st.text(max_size=4), st.floats() | st.integers(), max_size=4),
)


@given(shortcut_values)
def test_the_per_type_shortcuts_agree_with_the_general_path(value: Any) -> None:
    try:
        expected: bytes | type[PoisonChange] = _general(value)
    except (PoisonChange, ValueError, TypeError):
        expected = PoisonChange
    if expected is PoisonChange:
        with pytest.raises(PoisonChange):
            encode_value(value, "Value")
    else:
        assert encode_value(value, "Value") == expected


_MAPPER = TableMapper(
    TableConfig("s.t", "s", "t", "sec", Template.parse("p"), None, None),
    TableInfo(
        "s.t", "s", "t", ("Id",), (Column("Id", "int"), Column("Value", "any"), Column("Other", "any"))
    ),
    max_row_bytes=1 << 30,
)


@given(shortcut_values | st.integers(), shortcut_values)
def test_a_mappers_row_encoding_agrees_with_encode_value(value: Any, other: Any) -> None:
    """TableMapper.encode inlines encode_value's shortcuts (the read path's hot loop)."""
    row = {"Id": 1, "Value": value, "Other": other}
    try:
        expected: dict[str, bytes] | type[PoisonChange] = {c: encode_value(v, c) for c, v in row.items()}
    except PoisonChange:
        expected = PoisonChange
    if expected is PoisonChange:
        with pytest.raises(PoisonChange):
            _MAPPER.encode(row, {"Id": 1})
    else:
        assert _MAPPER.encode(row, {"Id": 1}) == expected


def test_a_mapper_names_the_column_of_a_value_it_cannot_encode() -> None:
    with pytest.raises(PoisonChange, match=r"^column Other: "):
        _MAPPER.encode({"Id": 1, "Value": 1, "Other": 10**5000}, {"Id": 1})
    with pytest.raises(PoisonChange, match=r"^column Value: "):
        _MAPPER.encode({"Id": 1, "Value": float("inf"), "Other": 1}, {"Id": 1})
    assert _MAPPER.encode({"Id": 1, "Value": 10**100}, {"Id": 1})["Value"] == b"1" + b"0" * 100


def test_encoded_values_do_not_keep_orjson_buffers() -> None:
    """orjson returns small texts in 4 KiB buffers; a queued change must not keep them."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [encode_value(f"text {i}", "Name") for i in range(1000)]
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(kept) == 1000 and grown < 200 * 1000


@given(
    st.builds(
        lambda sign, digits, exponent: Decimal((sign, tuple(digits), exponent)),
        st.integers(0, 1),
        st.lists(st.integers(0, 9), min_size=1, max_size=40),
        st.integers(-45, 45),
    )
)
def test_a_decimals_shortcut_writes_the_fixed_point_digits(value: Decimal) -> None:
    """The decimal shortcut takes ``str`` where it is fixed point; every
    coefficient and exponent (str switches to an exponent above 0 and below
    1e-6) must give ``format(value, "f")``'s digits."""
    assert encode_value(value, "Amount") == b'"%b"' % format(value, "f").encode()
