"""Redis key names: the layout of DESIGN.md §4, in one place.

Every name a reader or writer of cdc-sync's Redis data uses is built here, so
the daemon, the subscriber client and the tests can never disagree::

    ns:{p}:section:dataKey      hash    one document (a row)
    ns:{p}:@index:section       set     data keys of the section's live documents
    ns:{p}:@seq                 string  the partition's sequence
    ns:{p}:@stream              stream  the partition's change messages, id <seq>-0
    ns:{p}:section              channel the section's change messages
    ns:@checkpoint:table        hash    version, updated_at, state
    ns:@deadletter              stream  changes that could not be applied
    ns:@worker:id               hash    heartbeat (with a TTL)
    ns:@workers                 zset    worker id -> when its heartbeat expires (Redis time, ms)
    ns:@partitions:section      set     partition values the section has written
    ns:@sections                set     sections that have a partitions set (the registry)
    ns:{p}:@fence               hash    table -> highest lease fencing token that wrote here
    ns:{p}:@wait                string  a marker written before a WAIT after a failed one (expires)
    ns:@lease:{table}           string  owner id of the table's lease, with a TTL
    ns:@fence:{table}           string  the table's fencing-token counter

``{p}`` is a Redis Cluster hash tag: all keys of one partition live in one
slot, so one Lua call can update them atomically. Partition values are
percent-encoded inside keys when they contain ``{``, ``}`` (which would end
the hash tag early), ``:`` (the segment separator) or ``%`` (so that the
encoding can be reversed). ``ns:@partitions:section`` is the one key DESIGN.md
lacks: it lets a re-snapshot sweep every partition a section has written, and
lets a subscriber find the sections of a partition.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

_ESCAPES = {"%": "%25", "{": "%7B", "}": "%7D", ":": "%3A"}


@lru_cache(maxsize=65536)
def encode_partition(value: str) -> str:
    """The partition value as it appears inside ``{...}``; reversible."""
    if not value:
        raise ValueError("a partition value cannot be empty (an empty hash tag {} hashes the whole key)")
    if not any(ch in value for ch in _ESCAPES):
        return value
    return "".join(_ESCAPES.get(ch, ch) for ch in value)


def decode_partition(text: str) -> str:
    """Inverse of ``encode_partition``."""
    if "%" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "%":
            out.append(chr(int(text[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Layout:
    """The key names of one namespace."""

    namespace: str

    def prefix(self, partition: str) -> str:
        """``ns:{p}:``, the start of every key of a partition."""
        return f"{self.namespace}:{{{encode_partition(partition)}}}:"

    def document(self, partition: str, section: str, key: str) -> str:
        return f"{self.prefix(partition)}{section}:{key}"

    def document_prefix(self, partition: str, section: str) -> str:
        """``ns:{p}:section:``: a document key is this plus the data key."""
        return f"{self.prefix(partition)}{section}:"

    def index(self, partition: str, section: str) -> str:
        return f"{self.prefix(partition)}@index:{section}"

    def seen(self, partition: str, section: str) -> str:
        """``ns:{p}:@seen:section``: the data keys a whole snapshot running now has
        written (its sweep deletes the live documents of the index it lacks)."""
        return f"{self.prefix(partition)}@seen:{section}"

    def seq(self, partition: str) -> str:
        return f"{self.prefix(partition)}@seq"

    def fence(self, partition: str) -> str:
        """``ns:{p}:@fence``: table -> highest lease fencing token that wrote here."""
        return f"{self.prefix(partition)}@fence"

    def lease(self, table: str) -> str:
        """``ns:@lease:{table}``: owner id, with the lease TTL (hash tag: same slot as its fence)."""
        return f"{self.namespace}:@lease:{{{table}}}"

    def lease_fence(self, table: str) -> str:
        """``ns:@fence:{table}``: the table's fencing-token counter, +1 per acquisition."""
        return f"{self.namespace}:@fence:{{{table}}}"

    def stream(self, partition: str) -> str:
        return f"{self.prefix(partition)}@stream"

    def wait_marker(self, partition: str) -> str:
        """``ns:{p}:@wait``: written (with a one-minute expiry) right before a
        WAIT that must also cover writes made on another connection
        (``publishers.durability``); its value means nothing."""
        return f"{self.prefix(partition)}@wait"

    def channel(self, partition: str, section: str) -> str:
        return f"{self.prefix(partition)}{section}"

    def checkpoint(self, table: str) -> str:
        return f"{self.namespace}:@checkpoint:{table}"

    def deadletter(self) -> str:
        return f"{self.namespace}:@deadletter"

    def worker(self, worker_id: str) -> str:
        return f"{self.namespace}:@worker:{worker_id}"

    def workers(self) -> str:
        """The registry of live workers: sidecars find each other here, not by SCAN."""
        return f"{self.namespace}:@workers"

    def partitions(self, section: str) -> str:
        return f"{self.namespace}:@partitions:{section}"

    def sections(self) -> str:
        """``ns:@sections``: every section that has a partitions set, so that
        readers find them without a SCAN of the keyspace."""
        return f"{self.namespace}:@sections"

    def partitions_pattern(self) -> str:
        """SCAN pattern matching every section's partitions set (namespaces
        and sections are ``[A-Za-z0-9_.-]``, so nothing needs glob-escaping)."""
        return f"{self.namespace}:@partitions:*"
