"""Partition and key templates: ``"{RegionId}"``, ``"{OrderId}:{LineNo}"``, or a literal."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.templates import Template, render_key_value


def test_a_literal_has_no_columns() -> None:
    template = Template.parse("app1")
    assert template.is_literal and template.columns == ()
    assert template.render({}) == "app1"
    assert template.source == "app1"


def test_a_column_reference() -> None:
    template = Template.parse("{RegionId}")
    assert template.columns == ("RegionId",) and not template.is_literal
    assert template.render({"RegionId": 7, "Id": 42}) == "7"


def test_columns_and_literal_text() -> None:
    template = Template.parse("order-{OrderId}:{LineNo}")
    assert template.parts == ((False, "order-"), (True, "OrderId"), (False, ":"), (True, "LineNo"))
    assert template.columns == ("OrderId", "LineNo")
    assert template.render({"OrderId": 1001, "LineNo": 3}) == "order-1001:3"


def test_the_default_key_joins_the_primary_key() -> None:
    template = Template.join(("OrderId", "LineNo"))
    assert template == Template.parse("{OrderId}:{LineNo}")
    assert template.render({"OrderId": 1001, "LineNo": 3}) == "1001:3"
    assert Template.join(("Id",)) == Template.parse("{Id}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{RegionId", "template '{RegionId': unbalanced braces"),
        ("RegionId}", "template 'RegionId}': unbalanced braces"),
        ("{{RegionId}}", "template '{{RegionId}}': unbalanced braces"),
        ("{{RegionId}", "template '{{RegionId}': unbalanced braces"),
        ("eu-}{RegionId}", "template 'eu-}{RegionId}': unbalanced braces"),
        ("{OrderId}:{LineNo", "template '{OrderId}:{LineNo': unbalanced braces"),
        ("{Region{Id}}", "template '{Region{Id}}': unbalanced braces"),
        ("{}", "template '{}': {} is not a column name"),
        ("{Region Id}", "template '{Region Id}': {Region Id} is not a column name"),
        ("{ RegionId }", "template '{ RegionId }': { RegionId } is not a column name"),
        ("{1Region}", "template '{1Region}': {1Region} is not a column name"),
        ("{Region-Id}", "template '{Region-Id}': {Region-Id} is not a column name"),
        ("{RegionId\n}", "template '{RegionId\\n}': {RegionId\n} is not a column name"),
        ("{dbo.RegionId}", "template '{dbo.RegionId}': {dbo.RegionId} is not a column name"),
        (
            "{RegionId]; DROP TABLE x --}",
            "template '{RegionId]; DROP TABLE x --}': {RegionId]; DROP TABLE x --} is not a column name",
        ),
        ("{@v}", "template '{@v}': {@v} is not a column name"),
        ("", "a template cannot be empty"),
    ],
)
def test_bad_templates(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        Template.parse(text)
    assert str(info.value) == message


def test_check_columns_accepts_primary_key_columns() -> None:
    Template.parse("{RegionId}").check_columns(("RegionId", "Id"))
    Template.parse("app1").check_columns(("Id",))
    Template.join(("OrderId", "LineNo")).check_columns(("OrderId", "LineNo"))


def test_check_columns_rejects_a_non_key_column() -> None:
    # a deleted row carries nothing but its key: a template over Status could not be rendered
    with pytest.raises(ValueError) as info:
        Template.parse("{Status}").check_columns(("Id",))
    assert str(info.value) == (
        "template '{Status}' uses 'Status', which is not a primary-key column (primary key: Id)"
    )


def test_check_columns_names_the_whole_primary_key() -> None:
    with pytest.raises(ValueError) as info:
        Template.parse("{OrderId}:{Sku}").check_columns(("OrderId", "LineNo"))
    assert str(info.value) == (
        "template '{OrderId}:{Sku}' uses 'Sku', which is not a primary-key column (primary key: OrderId, LineNo)"
    )


def test_check_columns_is_case_sensitive() -> None:
    with pytest.raises(ValueError, match=r"uses 'regionid', which is not a primary-key column"):
        Template.parse("{regionid}").check_columns(("RegionId",))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (42, "42"),
        (-7, "-7"),
        (2**63 - 1, "9223372036854775807"),
        ("EU-West", "EU-West"),
        (Decimal("10.50"), "10.50"),
        (True, "1"),
        (False, "0"),
        (b"\x01\xab", "01ab"),
        (bytearray(b"\x01\xab"), "01ab"),
        (memoryview(b"\x01\xab"), "01ab"),
        (uuid.UUID("9F1C6E2A-3B4D-4C5E-8F60-7A1B2C3D4E5F"), "9f1c6e2a-3b4d-4c5e-8f60-7a1b2c3d4e5f"),
        (dt.date(2026, 11, 21), "2026-11-21"),
        (dt.datetime(2026, 11, 21, 23, 0, 0, 123456), "2026-11-21T23:00:00.123456"),
        (dt.time(8, 30), "08:30:00"),
    ],
)
def test_key_values_read_as_plain_text(value: object, text: str) -> None:
    assert render_key_value(value) == text
    assert Template.parse("{Id}").render({"Id": value}) == text


identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
literals = st.text(st.characters(codec="utf-8", exclude_characters="{}"), min_size=1, max_size=8)
pieces = st.tuples(st.just(True), identifiers) | st.tuples(st.just(False), literals)


def _separated(written: list[tuple[bool, str]]) -> bool:
    """No two column references side by side, and no literal '%' beside several
    columns (``{a}{b}`` and ``{a}%{b}`` are refused: test_stranger_keys)."""
    if sum(is_column for is_column, _ in written) > 1 and any("%" in p for c, p in written if not c):
        return False
    return not any(first[0] and second[0] for first, second in itertools.pairwise(written))


@given(st.lists(pieces, min_size=1, max_size=6).filter(_separated))
def test_parse_reads_back_what_was_written(written: list[tuple[bool, str]]) -> None:
    text = "".join(f"{{{piece}}}" if is_column else piece for is_column, piece in written)
    template = Template.parse(text)
    assert template.source == text
    assert "".join(f"{{{p}}}" if is_column else p for is_column, p in template.parts) == text
    assert template.columns == tuple(piece for is_column, piece in written if is_column)
    rendered = template.render({column: f"<{column}>" for column in template.columns})
    reserved = {"%", *"".join(piece for is_column, piece in written if not is_column)}

    def value(column: str) -> str:  # several columns: '%' and the literal text's characters encoded
        if len(template.columns) < 2:
            return f"<{column}>"
        return "".join(f"%{ord(c):02X}" if c in reserved else c for c in f"<{column}>")  # ASCII here

    assert rendered == "".join(value(piece) if is_column else piece for is_column, piece in written)


@given(literals)
def test_any_text_without_braces_is_a_literal(text: str) -> None:
    template = Template.parse(text)
    assert template.is_literal and template.render({}) == text


@given(literals, literals)
def test_a_stray_brace_anywhere_is_unbalanced(before: str, after: str) -> None:
    for brace in "{}":
        with pytest.raises(ValueError, match="unbalanced braces"):
            Template.parse(f"{before}{{Id}}{brace}{after}")
        with pytest.raises(ValueError, match="unbalanced braces"):
            Template.parse(f"{before}{brace}{{Id}}{after}")


KEY_VALUES = st.one_of(
    st.integers(),
    st.text(),
    st.binary(max_size=8),
    st.booleans(),
    st.dates(),
    st.uuids(),
    st.decimals(allow_nan=False, allow_infinity=False),
)


@pytest.mark.parametrize(
    "source", ["app1", "{a}", "r{a}", "{b}-x", "p{b}q", "{a}:{b}", "{a}/{b}", "a%{a}", "{b}.{a}", "x{a}y{b}z"]
)
@given(a=KEY_VALUES, b=KEY_VALUES)
def test_a_snapshot_renders_a_records_key_as_the_template_does(source: str, a: object, b: object) -> None:
    """The snapshot's renderer from a record (``cdc.snapshot_pages``), without a dict per row."""
    from cdc.snapshot_pages import _renderer

    template = Template.parse(source)
    assert _renderer(template, ("a", "b"))((a, b, "the row's text")) == template.render({"a": a, "b": b})
