"""Cost of reading change messages exactly (publishers/exact_json.py).

Usage: ``python -m bench.json_reader``. No servers: decodes messages shaped
like the ones the apply script writes, and prints microseconds per message
(the best of 5 repeats) for

- ``orjson.loads``: what the readers used before (not exact: floats, depth 1024);
- ``json.loads(parse_float=Decimal)``: the standard library made exact
  (every non-integer a Decimal; recursion-limited, about 1000 levels);
- ``exact_json.loads``: the readers now (orjson when no number is at risk);

and the cost of applying a message's patch: ``jsonpatch.apply_patch`` (what
the subscriber used) against ``publishers.patching.apply_patch``.
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import jsonpatch
import orjson

from publishers import exact_json, patching

_HEAD = (
    b'{"seq":1043,"partition":"app1","section":"forecasts","key":"42","op":"%b","version":88121,'
    b'"table":"public.forecasts","ts":"2026-11-21T23:00:00.123456Z","patch":%b}'
)
_ROW = (
    b'{"id":42,"region":7,"name":"Forecast for the north-west region","qty":1250,'
    b'"price":"12.50","big":1152921504606846976,"ratio":0.125,'
    b'"valid_from":"2026-11-21T23:00:00.123456+00:00","valid_to":"2026-11-22T23:00:00+00:00",'
    b'"tags":{"kind":"daily","source":"model-3","weights":[0.5,0.25,0.25]}}'
)


def _deep(levels: int) -> bytes:
    return b'{"a":' * levels + b"3.141592653589793238462643383279" + b"}" * levels


MESSAGES: dict[str, bytes] = {
    "insert, 10 columns (fast path)": _HEAD % (b"I", b'[{"op":"replace","path":"","value":%b}]' % _ROW),
    "update, 3 columns (fast path)": _HEAD
    % (
        b"U",
        b'[{"op":"replace","path":"/qty","value":1300},{"op":"replace","path":"/price","value":"13.00"},'
        b'{"op":"replace","path":"/valid_to","value":"2026-11-23T23:00:00+00:00"}]',
    ),
    "insert, a jsonb of 30 digits (exact path)": _HEAD
    % (
        b"I",
        b'[{"op":"replace","path":"","value":%b}]'
        % _ROW.replace(b'"ratio":0.125', b'"ratio":3.141592653589793238462643383279'),
    ),
    "insert, jsonb 300 levels": _HEAD % (b"I", b'[{"op":"replace","path":"/j","value":%b}]' % _deep(300)),
    "insert, jsonb 1000 levels": _HEAD % (b"I", b'[{"op":"replace","path":"/j","value":%b}]' % _deep(1000)),
    "insert, jsonb 13000 levels (iterative)": _HEAD
    % (b"I", b'[{"op":"replace","path":"/j","value":%b}]' % _deep(13_000)),
}

READERS: dict[str, Callable[[bytes], Any]] = {
    "orjson.loads": orjson.loads,
    "json.loads(parse_float=Decimal)": lambda raw: json.loads(raw, parse_float=Decimal),
    "exact_json.loads": exact_json.loads,
}


def best_us(call: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def _cell(read: Callable[[bytes], Any], raw: bytes, number: int) -> str:
    try:
        return f"{best_us(lambda: read(raw), number):10.1f}"
    except (ValueError, RecursionError) as exc:
        return f"{type(exc).__name__:>10}"


def main() -> None:
    print(f"{'message':42} {'bytes':>7} " + " ".join(f"{name:>33}" for name in READERS))
    for label, raw in MESSAGES.items():
        number = 20 if len(raw) > 10_000 else 2000
        cells = " ".join(f"{_cell(read, raw, number):>33}" for read in READERS.values())
        print(f"{label:42} {len(raw):7} {cells}")
    print(f"\n{'patch of':42} {'jsonpatch.apply_patch':>33} {'patching.apply_patch':>33}")
    for label, raw in MESSAGES.items():
        patch = exact_json.loads(raw)["patch"]
        number = 20 if len(raw) > 10_000 else 2000
        old, new = (
            _patch_cell(apply, patch, number) for apply in (jsonpatch.apply_patch, patching.apply_patch)
        )
        print(f"{label:42} {old:>33} {new:>33}")


def _patch_cell(apply: Callable[[Any, Any], Any], patch: list[dict[str, Any]], number: int) -> str:
    """Each call patches a fresh document holding every column the patches name."""
    try:
        return f"{best_us(lambda: apply({'qty': 1, 'price': '1', 'valid_to': '', 'j': None}, patch), number):10.1f}"
    except RecursionError:
        return f"{'Recursion':>10}"


if __name__ == "__main__":
    main()
