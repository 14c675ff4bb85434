"""RFC 6902 JSON Patch, applied without recursion.

The ``jsonpatch`` package (1.47) deep-copies each operation's value with
``copy.deepcopy``, which recurses: a value nested about 500 levels deep
raises ``RecursionError`` (measured), while the mirror holds JSON columns as
deep as the database accepts (more than 13,000 levels on PostgreSQL 15). Here
JSON Pointers (RFC 6901) are walked in a loop and values are copied with
``exact_json.copy``, so any depth applies.

Every operation of RFC 6902 §4 is implemented: the product emits ``replace``
(of the root or of a column), ``add`` and ``remove`` of a column; ``move``,
``copy`` and ``test`` are there for patches from elsewhere. A patch that does
not fit the document raises ``jsonpatch.JsonPatchConflict`` (a
``JsonPatchException``), a failed ``test`` ``JsonPatchTestFailed``, a malformed
operation ``InvalidJsonPatch``: the exceptions ``jsonpatch`` raises, so code
written against it keeps working.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from jsonpatch import InvalidJsonPatch, JsonPatchConflict, JsonPatchTestFailed

from publishers import exact_json

Container = dict[str, Any] | list[Any]


def apply_patch(document: Any, patch: list[dict[str, Any]]) -> Any:
    """``document`` after ``patch``; containers are changed in place, and the
    result is returned (a root ``replace`` returns a new value). Values are
    copied out of the patch, so the result never shares objects with it.

    The operations the publisher emits (DESIGN.md §5: a root ``replace`` for
    I, S and D; ``replace``, ``add`` and ``remove`` of top-level members for
    U) take a fast path (``_fast``) when they fit the document; any other
    operation, and any that does not fit, goes through ``apply_operation``,
    which applies it or raises what ``jsonpatch`` raises. Operations apply in
    order either way, so the outcome, the error and what was changed before
    it are the same as the general path's."""
    for operation in patch:
        done = _fast(document, operation)
        document = apply_operation(document, operation) if done is _UNFIT else done
    return document


_UNFIT = object()  # _fast's answer for an operation it leaves to apply_operation


def _fast(document: Any, operation: Any) -> Any:
    """The document after one operation the publisher emits, applied directly
    when it certainly succeeds; else ``_UNFIT``. Measured on the drain
    benchmark's messages (ten columns, a JSON object among them): 9 us of
    the general path's 12 per message were its pointer parsing and lookups."""
    if type(operation) is not dict:
        return _UNFIT
    op, path = operation.get("op"), operation.get("path")
    if type(path) is not str:
        return _UNFIT
    if not path:
        if op == "replace" and "value" in operation:
            return _copy(operation["value"])
        return _UNFIT
    if type(document) is not dict or path[0] != "/" or "/" in path[1:]:
        return _UNFIT  # not a member of an object: the general path walks it
    name = path[1:]
    if "~" in name:
        name = name.replace("~1", "/").replace("~0", "~")
    if op == "replace" or op == "add":
        if "value" not in operation or (op == "replace" and name not in document):
            return _UNFIT
        value = operation["value"]
        document[name] = value if type(value) in _SCALARS else _copy(value)  # a column's usual value: kept
        return document
    if op == "remove" and name in document:
        del document[name]
        return document
    return _UNFIT


def _copy(value: Any, depth: int = 0) -> Any:
    """``exact_json.copy``, recursing while the value is shallow (a row's
    usual shape: scalars and the odd small JSON column), which is several
    times faster; a deep value is handed to ``exact_json.copy``, which has no
    depth limit."""
    kind = type(value)
    if kind is dict:
        if depth > _SHALLOW:
            return exact_json.copy(value)
        copied = value.copy()
        if not _SCALARS.issuperset(map(type, copied.values())):  # a C pass: usually all scalars
            for k, v in copied.items():  # (replacing values, not keys, while iterating is allowed)
                if type(v) not in _SCALARS:
                    copied[k] = _copy(v, depth + 1)
        return copied
    if kind is list:
        if depth > _SHALLOW:
            return exact_json.copy(value)
        if _SCALARS.issuperset(map(type, value)):
            return value.copy()
        return [v if type(v) in _SCALARS else _copy(v, depth + 1) for v in value]
    return exact_json.copy(value) if isinstance(value, _CONTAINERS) else value  # a subclass, or a scalar


_SHALLOW = 32  # levels copied by recursion, far below the interpreter's limit
_CONTAINERS = (dict, list)
# Immutable JSON scalars, by exact type: kept, not copied. Any other type (a
# container, a subclass) goes through ``_copy`` itself.
_SCALARS = frozenset({str, int, float, bool, type(None), Decimal})


def apply_operation(document: Any, operation: dict[str, Any]) -> Any:
    op = _member(operation, "op")
    path = _pointer(_member(operation, "path"), operation)
    if op == "add":
        return _add(document, path, exact_json.copy(_member(operation, "value")), operation)
    if op == "remove":
        _remove(document, path, operation)
        return document
    if op == "replace":
        return _replace(document, path, exact_json.copy(_member(operation, "value")), operation)
    if op == "test":
        if not exact_json.equal(_get(document, path, operation), _member(operation, "value")):
            raise JsonPatchTestFailed(f"test failed: {_member(operation, 'path')!r} differs", op=operation)
        return document
    if op in ("move", "copy"):
        source = _pointer(_member(operation, "from"), operation)
        if op == "copy":
            return _add(document, path, exact_json.copy(_get(document, source, operation)), operation)
        if path[: len(source)] == source and len(path) > len(source):
            raise JsonPatchConflict("cannot move a value into one of its own members", op=operation)
        value = _get(document, source, operation)
        _remove(document, source, operation)
        return _add(document, path, value, operation)
    raise InvalidJsonPatch(f"unknown operation {op!r}", op=operation)


def _member(operation: dict[str, Any], name: str) -> Any:
    if not isinstance(operation, dict) or name not in operation:
        raise InvalidJsonPatch(f"the operation has no {name!r} member: {operation!r}"[:200], op=operation)
    return operation[name]


def _pointer(text: Any, operation: dict[str, Any]) -> list[str]:
    """The reference tokens of a JSON Pointer (RFC 6901 §3-4)."""
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise InvalidJsonPatch(f"{text!r} is not a JSON Pointer", op=operation)
    if not text:
        return []
    return [token.replace("~1", "/").replace("~0", "~") for token in text[1:].split("/")]


def _get(document: Any, path: list[str], operation: dict[str, Any]) -> Any:
    value = document
    for token in path:
        value = _child(value, token, operation)
    return value


def _parent(document: Any, path: list[str], operation: dict[str, Any]) -> Container:
    parent = _get(document, path[:-1], operation)
    if not isinstance(parent, dict | list):
        raise JsonPatchConflict(f"{_text(path[:-1])!r} is not an object or an array", op=operation)
    return parent


def _child(value: Any, token: str, operation: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        if token not in value:
            raise JsonPatchConflict(f"no member {token!r}", op=operation)
        return value[token]
    if isinstance(value, list):
        return value[_index(value, token, operation, end=len(value) - 1)]
    raise JsonPatchConflict(f"cannot look up {token!r} in a {type(value).__name__}", op=operation)


def _index(array: list[Any], token: str, operation: dict[str, Any], *, end: int) -> int:
    """An array index (RFC 6901 §4: digits without a leading zero), at most ``end``."""
    if token == "-" and end == len(array):
        return end
    if not token.isascii() or not token.isdigit() or (token.startswith("0") and token != "0"):
        raise JsonPatchConflict(f"{token!r} is not an index of an array", op=operation)
    index = int(token)
    if index > end:
        raise JsonPatchConflict(f"index {index} is beyond the array's {len(array)} items", op=operation)
    return index


def _add(document: Any, path: list[str], value: Any, operation: dict[str, Any]) -> Any:
    if not path:
        return value
    parent = _parent(document, path, operation)
    if isinstance(parent, dict):
        parent[path[-1]] = value
    else:
        parent.insert(_index(parent, path[-1], operation, end=len(parent)), value)
    return document


def _remove(document: Any, path: list[str], operation: dict[str, Any]) -> None:
    if not path:
        raise JsonPatchConflict("cannot remove the whole document", op=operation)
    parent = _parent(document, path, operation)
    _child(parent, path[-1], operation)  # it must exist
    if isinstance(parent, dict):
        del parent[path[-1]]
    else:
        del parent[int(path[-1])]


def _replace(document: Any, path: list[str], value: Any, operation: dict[str, Any]) -> Any:
    if not path:
        return value
    parent = _parent(document, path, operation)
    _child(parent, path[-1], operation)  # it must exist
    if isinstance(parent, dict):
        parent[path[-1]] = value
    else:
        parent[int(path[-1])] = value
    return document


def _text(path: list[str]) -> str:
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in path)
