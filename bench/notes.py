"""The narrative part of bench/RESULTS.md: how to read the figures, what was
changed in the product to reach them, and why the missed targets are missed.
Kept here so that every run writes it again beside its own figures."""

NOTES = """
## How to read these figures

- Every figure above comes from this one run; the ratios in the targets table compare figures of
  the same run. The machine has 2 vCPUs for PostgreSQL, Redis, the sidecar and the load generators,
  and is shared: see "Quiet machine" at the top. Figures move by 10-30% between runs on it.
- Drain: the sidecar is one Python process on one core. Per change it spends 45-65 µs of CPU (the
  "sidecar CPU µs/change" column: reading and decoding the row, encoding ten JSON values, building
  the Lua call), Redis 25-35 µs (the apply script), PostgreSQL ~6 µs. The batch applier is the
  bottleneck: it sends a batch, waits for Redis, then takes and builds the next one, so building
  (~5 ms per 500 changes) and waiting for the event loop (the trackers reading and encoding) are not
  overlapped with Redis; the trackers, ahead of it, mostly wait for room in the queue. Larger batches
  amortize that, hence the better figures at 2000.
- Snapshot: one table, one partition, so one Lua call per batch, each sent after the last returned:
  the sidecar's ~37 µs of CPU per row and Redis's ~35 µs per row hardly overlap.
- Latency at 10,000 changes/s is at the edge of this machine's capacity once the writer (10,000
  trigger executions/s in PostgreSQL), the subscriber and the sidecar share its two cores: on a quiet
  machine the sidecar keeps up (a quick run measured p99 51 ms with wake-up), under other load it
  falls behind and the latency grows for the whole run. Nothing is dropped: every run waits until
  every change is published and counts all of them.
- The ceiling and the naive baseline move between runs too (ceiling at batch 500: 23,000-34,000/s;
  naive: 3,400-4,200/s in the runs made during this work), and the ratios with them.
- Memory is bounded by configuration, not by the backlog: at most ``queue_capacity`` (10,000) encoded
  changes, and per tracked table one page (``page_size``, 5,000 rows) being read. A backlog smaller
  than ten pages (the quick mode's) does not reach that bound, so only the full mode can show the
  plateau.

## What was changed in the product to reach them

Each change was found with py-spy profiles of `cdc run` during these benchmarks; the before/after
figures are from development runs on this machine (same sizes as the quick mode, varying load).

1. **Memory: orjson's 4 KiB buffers** (`cdc/values.py`). orjson 3.12+ returns every `dumps()`
   result inside a buffer of at least 4 KiB that it never shrinks, so each encoded column value
   held 4 KiB and a queued change of ten columns 40 KiB: draining a backlog peaked at 545 MB RSS.
   Encoded values are now copied to exact-size bytes (`b"%b" % text`, the cheapest exact copy):
   155 MB.
2. **Garbage collector** (`cdc/commands.py`, `tune_gc`). With Python's default thresholds the cyclic
   GC ran full collections over the 10,000 queued changes and the pages being read every ~10,000
   changes: a quarter of the sidecar's CPU. `cdc run` now freezes the start-up objects and uses
   thresholds (50,000, 20, 20): ~70 -> ~55 µs of CPU per drained change.
3. **Encoding** (`cdc/values.py`, `cdc/mapping.py`). `encode_value` dispatches on the exact type
   of the common values (int, str, Decimal, datetime, date, UUID, JSON objects...) to a shortcut
   and keeps the general path for the rest; a property test checks that both agree. A ten-column
   row: 11.8 -> 7.4 µs.
4. **PostgreSQL read path** (`cdc/sources/pg_types.py`, `pg_reads.py`, `postgres.py`).
   - The tolerant date/timestamp/timestamptz loaders subclassed psycopg's Python loaders, which
     silently replaced psycopg's C loaders; they now wrap the C ones.
   - json/jsonb (every change row carries one: its changed columns) load with orjson where that is
     exact (not for numbers of 19+ digits, which go to the standard library as before).
   - Rows are converted with the table's names looked up once per page, not per row.
   - Pages are loaded and converted 500 rows at a time, yielding to the event loop in between: a
     5,000-row page held the loop for 100-200 ms, during which the batch applier could not send
     the next batch and Redis sat idle.
   - A read that fits in 500 rows (every poll of a quiet table, every read of a table that keeps
     up) is one statement without a transaction: window check and rows in one snapshot, one round
     trip instead of four (BEGIN, window, rows, COMMIT). A read that does not fit is read in a
     transaction with a held cursor, as before.
5. **Batch queue** (`cdc/batching.py`). A producer whose `put` finds room never yields, so the
   applier waited for the producers to fill the queue before it could send the next batch: they now
   yield every 64 changes.
6. **Snapshot sweep** (`publishers/manager.py`, `stale_keys`). After a snapshot, the check of every
   document's `@v` was one pipelined HGET per document, and parsing those replies in redis-py was 15%
   of a snapshot's CPU; it is now one read-only Lua call per index page that returns only the stale
   keys. Snapshot: 5,300 -> 12,700 rows/s (with items 1-4).
7. **Idle tables** (`cdc/tracker.py`). A table whose reads find nothing rewrote its checkpoint at
   every poll (a Redis script call); it now does so every 30 s (changes applied: every second, as
   before). Its backoff wait made two tasks per wait, which cost more than the poll; it now waits on
   one event with a timeout (a tracker's stop event also wakes it). With 1. and the one-statement
   read: 50 idle tables, first 15 s after catch-up 15.9% -> 7%, steady state 4.7% -> 3.6% of a core.
8. **Metrics** (`cdc/daemon.py`): the applied-changes counter is incremented once per table per
   batch instead of once per change.
9. **`source.notify`** (config schema, `cdc/config.py`, docs/CONFIG.md, examples/tables.yaml,
   `PostgresSource.wait_for_changes`): `notify: false` makes the PostgreSQL source listen to nothing,
   so the trackers rely on their backoff alone; the latency benchmark's "without wake-up" runs use it.

## Why the missed targets are missed

- **Drain >= 5x the naive baseline.** The naive client here is bound by round trips (about 150 µs
  each through redis-py's asyncio client on this VM's loopback), so it does 3,000-4,000 changes/s,
  and 5x is 15,000-20,000/s: 60-75% of the apply ceiling itself, and more than one Python process
  that spends ~55 µs of CPU per change can do (18,000/s at 100% of a core, with perfect overlap of
  PostgreSQL, Redis and Python on two cores). The two drain targets together assume a naive client
  about 12x slower than the ceiling; on this machine it is 7-8x slower. The pipelined naive client
  (one round trip per change) is measured too and is no faster here.
- **Snapshot >= 50,000 rows/s.** Every snapshot row goes through the apply script like any change
  (HMGET, HSET, SADD, then XADD, INCR and PUBLISH of an `S` message): Redis alone spends ~25 µs per
  row on it here, so even the apply path on its own stays under ~30,000 rows/s (`bench/results/APPLY.md`
  and the ceiling above); the sidecar adds ~40 µs of CPU per row (read, encode, build). 50,000 rows/s
  needs a different snapshot apply (for instance bulk loading without a stream entry and a publish
  per row), which changes what subscribers receive during a snapshot (DESIGN.md §5): not done here.
- **Idle CPU < 2% for 50 tables**: met in steady state, missed in the first minute after the tables
  go quiet. Right after a table goes quiet its backoff polls at 50 ms, then 200 ms, then 1 s: 50
  tables make ~100 polls/s in the first seconds and ~50/s up to the 83rd second, then 10/s once every
  backoff is at its 5 s step. A poll costs ~0.3 ms of CPU (one round trip through psycopg's asyncio
  connection) plus bookkeeping, so the first minute is the backoff configuration's cost (fewer or
  longer early steps lower it). In steady state a good part of the CPU is the lease upkeep: every
  `lease_ttl / 3` (3.3 s) each table's lease renewal and snapshot-request check are separate Redis
  round trips (~0.15 ms of CPU each through redis-py): ~30 calls/s for 50 tables (the "Redis
  commands/s" column). One pipeline or script per round would remove most of it; that code was being
  written by another engineer during this work and is left to them.
- **Drain >= 40% of the ceiling at max_batch_size 100 and 500**: met in some runs (49% at 500 in a
  quick run), missed in others; see the applier bottleneck above. Overlapping the build of the next
  batch with Redis's execution of the current one (two batches in flight on one connection) would
  raise it, but a batch that fails half-way would then be retried after a later one was applied,
  which breaks the per-partition publication order (DESIGN.md §4): not done.

## Noticed and left alone

- The lease upkeep above; and under heavy CPU load (a tracemalloc-instrumented run) every lease
  expired ("lease lost") because the event loop was too busy to renew them within `lease_ttl`.
- redis-py's asyncio client costs ~150 µs of CPU per command (pipelines and scripts amortize it);
  psycopg's asyncio connection ~250 µs per statement.
- `apply.lua` spends ~25-35 µs of Redis time per change, mostly in the Lua-to-Redis bridge (see
  `bench/results/APPLY.md`); that is the apply ceiling.
- `ChangeRow.changed_columns` is computed for every update and used by nobody downstream.
"""
