"""The change message of DESIGN.md §5, as subscribers receive it.

The apply script writes the message by splicing JSON text; this module is the
reading side: decoding a stream entry, applying its patch to a document, and
the JSON Schema (``schemas/change-message.schema.json``) that tests validate
every published message against.

Reading keeps every value the message holds (``exact_json``): integers of any
size, non-integers beyond a float64 as ``Decimal``, any depth of nesting; and
the patch applies at any depth (``patching``).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from publishers import exact_json, patching
from publishers.errors import CdcError

Message = dict[str, Any]
Document = dict[str, Any]


def decode_message(raw: bytes | str) -> Message:
    """A message from its JSON text, every value exact (``exact_json.loads``:
    integers stay ints; a non-integer is a float when the float is that
    number, else a Decimal; any depth)."""
    message: Message = exact_json.loads(raw)
    return message


def apply_patch(document: Document | None, patch: list[dict[str, Any]]) -> Document | None:
    """``document`` after ``patch`` (RFC 6902), changed in place; ``None`` stands
    for no document. The patch's values are copied, never shared.

    Raises ``jsonpatch.JsonPatchException`` (``JsonPatchConflict``) when the
    patch does not fit the document, which means the replica missed something
    and must be reloaded.
    """
    result: Document | None = patching.apply_patch(document, patch)
    return result


def stream_seq(entry_id: bytes | str) -> int:
    """The seq of a stream entry id ``<seq>-0``."""
    if isinstance(entry_id, bytes):
        return int(entry_id.partition(b"-")[0])  # (int reads ASCII digits from bytes: no decode)
    return int(entry_id.partition("-")[0])


@cache
def message_schema() -> dict[str, Any]:
    """The change-message JSON Schema, from the installed package or the source tree.

    The wheel ships a copy inside ``publishers`` (pyproject.toml), so that
    looking it up never imports ``cdc``."""
    candidates = [
        resources.files("publishers").joinpath("schemas/change-message.schema.json"),
        Path(__file__).resolve().parent.parent / "schemas" / "change-message.schema.json",
    ]
    for candidate in candidates:
        if candidate.is_file():
            schema: dict[str, Any] = json.loads(candidate.read_text(encoding="utf-8"))
            return schema
    raise CdcError("change-message.schema.json is missing from the installation")
