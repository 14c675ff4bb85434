"""publishers.patching: RFC 6902 as the RFC's own examples (Appendix A) say,
at any depth, with the exceptions ``jsonpatch`` raises."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from jsonpatch import InvalidJsonPatch, JsonPatchConflict, JsonPatchException, JsonPatchTestFailed

from publishers import exact_json
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
