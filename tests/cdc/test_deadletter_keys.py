"""Recovering a dead letter entry's primary key (``cdc.deadletter_keys``), and
the in-memory source's rows by key."""

from __future__ import annotations

from cdc.config import TableConfig
from cdc.deadletter_keys import read_template, recover_key
from cdc.sources.memory import MemorySource
from cdc.templates import Template
from publishers.deadletters import DeadLetter


def letter(partition: str = "", key: str = "", values: str = "null") -> DeadLetter:
    return DeadLetter("1-0", "s.t", partition, "s", key, "U", "5", "why", values, "")


def test_a_rendered_key_reads_back_to_its_values() -> None:
    two = Template.parse("{a}:{b}")
    rendered = two.render({"a": "x:y%", "b": "z"})
    assert rendered == "x%3Ay%25:z" and read_template(two, rendered) == {"a": "x:y%", "b": "z"}
    assert read_template(Template.parse("user-{id}"), "user-a-b") == {"id": "a-b"}
    assert (
        read_template(Template.parse("app"), "app") == {}
        and read_template(Template.parse("app"), "x") is None
    )
    assert read_template(Template.parse("u-{id}"), "v-1") is None


def test_the_key_comes_from_the_address_then_from_the_values() -> None:
    pk = ("region", "id")
    partition, key = Template.parse("{region}"), Template.parse("{id}")
    assert recover_key(letter("eu", "7"), partition, key, pk) == {"region": "eu", "id": "7"}
    values = '{"key": {"region": "eu", "id": "8"}}'
    assert recover_key(letter(values=values), partition, key, pk) == {"region": "eu", "id": "8"}
    encoded = '{"region": "eu", "id": 9, "v": "x"}'
    assert recover_key(letter(values=encoded), partition, key, pk) == {"region": "eu", "id": 9}
    assert recover_key(letter(values='{"v": 1}'), partition, key, pk) is None
    assert recover_key(letter(), partition, key, pk) is None


async def test_the_memory_source_reads_rows_by_key_as_text() -> None:
    source = MemorySource()
    source.create_table("s.t", {"id": "int", "v": "text"}, ["id"])
    source.insert("s.t", {"id": 1, "v": "a"})
    info = await source.describe(TableConfig("s.t", "s", "t", "t", Template.parse("p"), None, None))
    found = await source.read_rows(info, [{"id": "1"}, {"id": 2}])
    assert found.rows == [{"id": 1, "v": "a"}, None] and found.version == await source.current_version()
