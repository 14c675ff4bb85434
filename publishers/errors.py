"""The root of cdc-sync's exception hierarchy and its Redis-side branches.

``publishers`` is usable alone by applications, so the errors it raises live
here; ``cdc.errors`` re-exports these same classes and adds the source-side
ones (the whole tree is drawn in its docstring)::

    CdcError                       base; ``exit_code`` is the command line's code
    ├── ConnectError               3  cannot connect at start-up
    ├── TransientError             1  worth retrying: link failure, timeout...
    │   └── RedisUnavailable          Redis went away, is loading, or is out of memory
    ├── PoisonChange               1  one change cannot be applied: dead letter it
    └── LeaseLost                  1  another sidecar owns the table now (fencing)
"""

from __future__ import annotations


class CdcError(Exception):
    """Base of every error cdc-sync raises on purpose."""

    exit_code = 1


class ConnectError(CdcError):
    """A server cannot be reached at start-up. Exit code 3."""

    exit_code = 3


class TransientError(CdcError):
    """A failure that may pass: retried with capped, jittered backoff."""


class RedisUnavailable(TransientError):
    """Redis is unreachable, loading, read-only, or out of memory."""


class PoisonChange(CdcError):
    """One change cannot be applied because of its content (it goes to the
    dead letter with this reason while the rest of its batch applies)."""


class LeaseLost(CdcError):
    """This sidecar no longer owns a table: another instance took it over."""
