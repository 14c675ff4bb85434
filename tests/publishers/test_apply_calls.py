"""A call's arguments (``publishers.apply_calls``): the JSON text of keys,
sections and columns is orjson's, byte for byte, and a call holds about the
size of its arguments (orjson's results are 4 KiB buffers: a call of 2,000
changes held 8 MB of key texts)."""

from __future__ import annotations

import tracemalloc

import orjson
import pytest

from publishers.apply_calls import CallBuilder, json_string, json_text
from publishers.layout import Layout
from publishers.model import Change

ODD = [
    "",
    "42",
    "plain key",
    'a "quoted" key',
    "back\\slash",
    "tab\there",
    "new\nline",
    "\x00nul",
    "\x1f unit separator",
    "\x7f delete",
    "line\u2028separator",
    "paragraph\u2029separator",
    "é accent",
    "日本語",
    "emoji 😀",
    "%2F percent",
    "{braces}:and:colons",
    "x" * 5000,
]


@pytest.mark.parametrize("text", ODD)
def test_json_string_is_orjson_byte_for_byte(text: str) -> None:
    assert json_string(text) == orjson.dumps(text) == json_text(text)


def test_json_string_is_orjson_for_every_code_point() -> None:
    """Alone and between ASCII text: what orjson escapes (quote, backslash,
    U+0000-U+001F) never takes the quoted-as-is path."""
    texts = (
        text
        for point in range(0x110000)
        if not 0xD800 <= point <= 0xDFFF  # surrogates: refused (below)
        for text in (chr(point), f"ab{chr(point)}cd")
    )
    differ = [text for text in texts if json_string(text) != orjson.dumps(text)]
    assert differ == []


def test_a_string_orjson_refuses_is_refused() -> None:
    with pytest.raises(orjson.JSONEncodeError):
        json_string("lone \ud800 surrogate")


@pytest.mark.parametrize("key", ["key-{}", "key\n{}"], ids=["plain", "escaped"])
def test_a_call_of_2000_keys_holds_about_their_size(key: str) -> None:
    changes = [Change("s.t", "p", "t", key.format(i), "U", i + 1, {"id": b"%d" % i}) for i in range(2000)]
    tracemalloc.start()
    try:
        builder = CallBuilder(Layout("ns"), "p")
        for change in changes:
            builder.add(change)
        keys, args = builder.keys_and_args((b"ts",))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert args.count(orjson.dumps(key.format(7))) == 1
    assert len(keys) == 3 + 1 + 2000
    assert held < 1_000_000, f"{held:,} bytes held by the arguments of 2,000 changes"
