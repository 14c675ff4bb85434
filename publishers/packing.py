"""Packing commands with hiredis.

redis-py's asyncio connections pack commands in pure Python (its blocking
ones use hiredis). An apply call is one EVALSHA with ~17 arguments per
change, and packing it was half of the apply path's CPU; hiredis packs it in C.
The connection classes of ``publishers.connection`` and
``publishers.sentinel`` call ``pack``.
"""

from __future__ import annotations

import hiredis  # a dependency (redis[hiredis]): its C parser and command packer
from redis.typing import EncodableT


def pack(args: tuple[EncodableT, ...]) -> list[bytes] | None:
    """The RESP bytes of a command, or None to let redis-py pack it (types
    hiredis does not take get redis-py's own error message)."""
    first = args[0]
    if isinstance(first, str) and " " in first:  # "SCRIPT LOAD": one word per argument
        args = (*first.split(), *args[1:])
    try:
        return [hiredis.pack_command(args)]  # type: ignore[arg-type]
    except TypeError:
        return None
