"""publishers.patching: RFC 6902 as the RFC's own examples (Appendix A) say,
at any depth, with the exceptions ``jsonpatch`` raises."""

from __future__ import annotations

import collections
from decimal import Decimal
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonpatch import InvalidJsonPatch, JsonPatchConflict, JsonPatchException, JsonPatchTestFailed
from jsonpointer import JsonPointerException

from publishers import exact_json, patching
from publishers.messages import apply_patch

# (document, patch, result): RFC 6902 Appendix A.1-A.16, those with a result
APPENDIX_A: list[tuple[Any, list[dict[str, Any]], Any]] = [
    ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux"}], {"baz": "qux", "foo": "bar"}),
    (
        {"foo": ["bar", "baz"]},
        [{"op": "add", "path": "/foo/1", "value": "qux"}],
        {"foo": ["bar", "qux", "baz"]},
    ),
    ({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
    ({"foo": ["bar", "qux", "baz"]}, [{"op": "remove", "path": "/foo/1"}], {"foo": ["bar", "baz"]}),
    (
        {"baz": "qux", "foo": "bar"},
        [{"op": "replace", "path": "/baz", "value": "boo"}],
        {"baz": "boo", "foo": "bar"},
    ),
    (
        {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
        [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
        {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
    ),
    (
        {"foo": ["all", "grass", "cows", "eat"]},
        [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
        {"foo": ["all", "cows", "eat", "grass"]},
    ),
    (
        {"baz": "qux", "foo": ["a", 2, "c"]},
        [
            {"op": "test", "path": "/baz", "value": "qux"},
            {"op": "test", "path": "/foo/1", "value": 2},
        ],
        {"baz": "qux", "foo": ["a", 2, "c"]},
    ),
    (
        {"foo": "bar"},
        [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
        {"foo": "bar", "child": {"grandchild": {}}},
    ),
    (
        {"foo": ["bar"]},
        [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
        {"foo": ["bar", ["abc", "def"]]},
    ),
    ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": 10}], {"/": 9, "~1": 10}),
    ({"foo": 1}, [{"op": "copy", "from": "/foo", "path": "/bar"}], {"foo": 1, "bar": 1}),
    # what the product emits: a root replace (insert, snapshot), and a delete's
    (None, [{"op": "replace", "path": "", "value": {"a": 1}}], {"a": 1}),
    ({"a": 1}, [{"op": "replace", "path": "", "value": None}], None),
]


@pytest.mark.parametrize(("document", "patch", "result"), APPENDIX_A)
def test_rfc_6902_appendix_a(document: Any, patch: list[dict[str, Any]], result: Any) -> None:
    assert apply_patch(document, patch) == result


@pytest.mark.parametrize(
    ("document", "patch", "error"),
    [
        ({"baz": "qux"}, [{"op": "test", "path": "/baz", "value": "bar"}], JsonPatchTestFailed),  # A.9
        ({"foo": "bar"}, [{"op": "add", "path": "/baz/bat", "value": "qux"}], JsonPatchConflict),  # A.12
        ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": "10"}], JsonPatchTestFailed),  # A.15
        ({"foo": "bar"}, [{"op": "replace", "path": "/nope", "value": 1}], JsonPatchConflict),
        ({"foo": [1]}, [{"op": "remove", "path": "/foo/1"}], JsonPatchConflict),
        ({"foo": [1]}, [{"op": "add", "path": "/foo/01", "value": 2}], JsonPatchConflict),
        ({"foo": {}}, [{"op": "move", "from": "/foo", "path": "/foo/a"}], JsonPatchConflict),
        (
            None,
            [{"op": "replace", "path": "/a", "value": 1}],
            JsonPatchConflict,
        ),  # a replica that missed the insert
        ({}, [{"op": "frob", "path": ""}], InvalidJsonPatch),
        ({}, [{"op": "add", "path": "a", "value": 1}], InvalidJsonPatch),
        ({}, [{"op": "add", "path": "/a"}], InvalidJsonPatch),
    ],
)
def test_a_patch_that_does_not_fit_raises_what_jsonpatch_raises(
    document: Any, patch: list[dict[str, Any]], error: type[JsonPatchException]
) -> None:
    with pytest.raises(error):
        apply_patch(document, patch)


def test_a_deep_value_applies_and_is_not_shared_with_the_patch() -> None:
    """jsonpatch 1.47 raised RecursionError here at about 500 levels (its deepcopy)."""
    depth = 13_099
    deep = exact_json.loads('{"a": ' * depth + "3.141592653589793238462643383279" + "}" * depth)
    patch = [{"op": "replace", "path": "/j", "value": deep}, {"op": "add", "path": "/k", "value": [1]}]
    document = apply_patch({"j": None}, patch)
    assert document is not None and exact_json.equal(document["j"], deep)
    assert document["j"] is not deep and document["k"] is not patch[1]["value"]
    inner = document["j"]
    for _ in range(depth):
        inner = inner["a"]
    assert inner == Decimal("3.141592653589793238462643383279")
    path = "/j" + "/a" * depth
    assert apply_patch(document, [{"op": "replace", "path": path, "value": 1}]) is document


# -- the fast path of the publisher's patch shapes -----------------------------------

members = st.sampled_from(["a", "b", "c/d", "e~f", ""])
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=3), st.floats(allow_nan=False))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(members, inner, max_size=3),
    max_leaves=8,
)
documents = st.none() | st.dictionaries(members, json_values, max_size=4) | st.lists(scalars, max_size=2)
pointers = members.map(lambda name: "/" + name.replace("~", "~0").replace("/", "~1"))
operations = st.one_of(
    st.builds(
        lambda value: {"op": "replace", "path": "", "value": value},
        st.none() | st.dictionaries(members, json_values, max_size=4),
    ),
    st.builds(lambda path, value: {"op": "replace", "path": path, "value": value}, pointers, json_values),
    st.builds(lambda path, value: {"op": "add", "path": path, "value": value}, pointers, json_values),
    st.builds(lambda path: {"op": "remove", "path": path}, pointers),
    st.builds(lambda path: {"op": "replace", "path": path}, pointers),  # malformed: no value
    st.just({"op": "replace", "path": "/a/0", "value": 1}),  # not a top-level member: the general path's
)


def general_path(document: Any, patch: list[dict[str, Any]]) -> Any:
    """The patch through ``apply_operation`` alone (the path before the fast one)."""
    for operation in patch:
        document = patching.apply_operation(document, operation)
    return document


def outcome(apply: Any, document: Any, patch: list[dict[str, Any]]) -> tuple[str, Any]:
    """(the error's type and message, or "ok"; the document as left, in place or returned)."""
    try:
        return "ok", apply(document, patch)
    except JsonPatchException as exc:
        return f"{type(exc).__name__}: {exc}", document


@settings(max_examples=500, deadline=None)
@given(documents, st.lists(operations, min_size=1, max_size=4))
def test_the_fast_path_agrees_with_the_general_path(document: Any, patch: list[dict[str, Any]]) -> None:
    """Same document, same error (type and message), same partial changes
    before the error, for every patch shape the publisher emits and near misses."""
    fast = outcome(apply_patch, exact_json.copy(document), exact_json.copy(patch))
    general = outcome(general_path, exact_json.copy(document), exact_json.copy(patch))
    assert fast[0] == general[0]
    assert exact_json.equal(fast[1], general[1])


@settings(max_examples=1000, deadline=None)
@given(documents, st.lists(operations, min_size=1, max_size=4))
def test_the_fast_path_fails_where_jsonpatch_fails(document: Any, patch: list[dict[str, Any]]) -> None:
    """jsonpatch raises a JsonPatchException (or, for a pointer into a scalar,
    JsonPointerException) exactly where this module raises its JsonPatchException,
    and where it applies, it gives the same document: the subscriber's reload
    on a patch that does not fit depends on it."""
    fast = outcome(apply_patch, exact_json.copy(document), exact_json.copy(patch))
    try:
        result = jsonpatch.apply_patch(exact_json.copy(document), exact_json.copy(patch))
        theirs = "ok"
    except (JsonPatchException, JsonPointerException):
        theirs = "error"
    except (TypeError, AttributeError, IndexError):  # jsonpatch on a None or scalar document
        theirs = "error"
    assert (fast[0] == "ok") == (theirs == "ok"), (fast, theirs)
    if theirs == "ok":  # and where both apply, to the same document
        assert exact_json.equal(fast[1], result), (fast[1], result)


@pytest.mark.parametrize(
    ("document", "patch", "error"),
    [
        ({"a": 1}, [{"op": "replace", "path": "/b", "value": 2}], JsonPatchConflict),  # missed the add
        ({"a": 1}, [{"op": "remove", "path": "/b"}], JsonPatchConflict),  # missed the add
        (None, [{"op": "add", "path": "/a", "value": 1}], JsonPatchConflict),  # missed the insert
        ({"a": 1}, [{"op": "replace", "path": "/a"}], InvalidJsonPatch),
    ],
)
def test_an_update_that_does_not_fit_raises_after_the_operations_before_it(
    document: Any, patch: list[dict[str, Any]], error: type[JsonPatchException]
) -> None:
    """The error jsonpatch raises; the operations before the failing one stay
    applied, as on the general path (the subscriber reloads the document)."""
    with pytest.raises(error):
        apply_patch(exact_json.copy(document), patch)
    if document is not None:
        with pytest.raises(error):
            apply_patch(document, [{"op": "add", "path": "/z", "value": [1]}, *patch])
        assert document["z"] == [1]


def test_the_fast_path_copies_values_out_of_the_patch() -> None:
    row = {"j": {"k": [1, {"m": 2}]}, "s": "x"}
    inserted = apply_patch(None, [{"op": "replace", "path": "", "value": row}])
    assert inserted == row and inserted is not row and inserted["j"]["k"][1] is not row["j"]["k"][1]  # type: ignore[index]
    value = [{"deep": [1]}]
    updated = apply_patch(inserted, [{"op": "add", "path": "/n", "value": value}])
    assert updated["n"] == value and updated["n"][0]["deep"] is not value[0]["deep"]  # type: ignore[index]


def _containers(value: Any) -> list[int]:
    """The ids of every dict and list in ``value``."""
    found, work = [], [value]
    while work:
        item = work.pop()
        if isinstance(item, dict | list):
            found.append(id(item))
            work += item.values() if isinstance(item, dict) else item
    return found


copied_values = st.recursive(
    scalars | st.decimals(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(members, inner, max_size=4)
        | st.dictionaries(members, inner, max_size=2).map(collections.OrderedDict)
    ),  # a subclass
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(copied_values)
def test_the_fast_paths_copy_is_a_deep_copy(value: Any) -> None:
    """``_copy`` (the fast path's, which keeps scalars and copies containers
    found by type) is ``exact_json.copy``: equal, and no dict or list shared
    with the patch, at any level."""
    copied = patching._copy(value)
    assert exact_json.equal(copied, exact_json.copy(value))
    assert not set(_containers(copied)) & set(_containers(value))
