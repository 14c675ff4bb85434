"""CPython's cyclic garbage collector in a process that holds a replica.

A replica is many long-lived containers (a document with a JSON column is a
dict holding dicts and lists), and following a stream makes a few
short-lived ones a message. With Python's default thresholds (700, 10, 10)
the collector's full collections, which visit every tracked object of the
process, took 25-40% of a subscriber's CPU while its replica grew to 50,000
documents (bench/subscriber_bench.py: 6 full collections, 0.9-1.4 s, of a
105,000-message run of 3.5 s). The sidecar has the same shape: its queue and
pages (``cdc run`` calls this at start).

The collector is the whole process's: a library does not change it behind
the application's back. An application that holds a large replica calls
``tune_gc()`` once, after its subscriber's first load (``await
subscriber.start()``): what exists then (modules, the loaded documents) is
frozen out of every collection (``gc.freeze``), and young objects are
collected every 50,000 allocations instead of 700. Only reference cycles
wait longer to be freed; documents and messages have none.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    """Freeze what exists now out of every collection, and collect young
    objects rarely (``THRESHOLDS``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
