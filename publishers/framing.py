"""Length-prefixed framing in C-level passes: the part that ``publishers.resp``
(RESP bulk strings) and ``publishers.mpack`` (MessagePack strings) share.

Each value costs a ``len``, a list lookup of its prebuilt head and its place
in one ``join``, instead of a Python-level call a value: the framing of a
call's ~20,000 values is its hot loop (publishers/resp.py has the figures).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# a head prebuilt for every length below this; a longer value's is made on its own
PREBUILT = 4096


def heads_table(head: Callable[[int], bytes]) -> list[bytes]:
    """``head(n)`` for every ``n`` below ``PREBUILT``."""
    return [head(n) for n in range(PREBUILT)]


def interleaved(values: Sequence[bytes], table: list[bytes], head: Callable[[int], bytes]) -> list[bytes]:
    """``[head of values[0], values[0], head of values[1], ...]``: ``table``
    for lengths below ``PREBUILT``, ``head`` for the rest."""
    try:
        heads = list(map(table.__getitem__, map(len, values)))
    except IndexError:  # a value of PREBUILT bytes or more
        heads = list(map(head, map(len, values)))
    framed: list[bytes] = [b""] * (2 * len(values))
    framed[0::2] = heads
    framed[1::2] = values
    return framed
