"""``cdc demo``: the product on one screen, on one machine.

1. stops what a previous demo in ``--dir`` left running, then starts a local
   PostgreSQL and redis-server on free loopback ports, their files under
   ``--dir`` (default ``.demo``)
2. creates two demo tables and writes ``<dir>/tables.yaml``, the config that
   registers them (an ordinary config file: read it, copy it; it names the
   demo's servers literally, so CDC_SOURCE_DSN/CDC_REDIS_URL exported in the
   shell never point it elsewhere)
3. enables change tracking (what ``cdc tracking enable`` does)
4. runs two sidecars (``cdc run``, sharing the tables through their leases),
   a writer that keeps inserting, updating and deleting rows, a subscriber per
   partition, and one screen that shows all of it (``k`` kills a sidecar:
   another takes its tables over)

Ctrl-C (or ``--duration``) stops everything in order and checks every row of
PostgreSQL against the subscribers' replicas.

Modules: ``app`` (start to stop), ``database`` (tables, config, reads),
``writer``, ``sidecars``, ``watch`` (gathering a ``view.View``), ``screen``
(rendering it: a pure function), ``terminal`` (where it is drawn),
``compare`` (the closing check), ``leftovers`` (``<dir>/pids.json``: what a
demo killed with SIGKILL left running, stopped by the next one).
"""

from cdc.demo.app import run_demo

__all__ = ["run_demo"]
