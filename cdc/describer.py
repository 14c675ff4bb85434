"""A table as the source describes it, and what a new description means.

The tracker describes its table at start-up, and again whenever the table
may have changed: the source's fingerprint of it moved (the pipeline checks
every ``SHAPE_CHECK_INTERVAL``), or a step failed. Each description

- resolves the table at the source (``ChangeSource.describe``): a table gone
  or renamed, a column the config names gone, a type without a mapping, a
  primary key gone all fail here, naming the table (and the config's line);
- checks that its changes are captured (``tracking_status``): tracking
  disabled, a re-created table not yet enabled again, a capture trigger
  dropped all fail here, saying how to turn it on;
- builds the table's ``TableMapper`` (its templates checked against the key);
- says whether the documents need a snapshot: the table's definition changed
  (``cdc.shapes.shape_change`` says how, for the log), or changes may have
  gone uncaptured meanwhile (tracking was off). A snapshot for a change that
  did not touch the published columns costs a read of the table; a snapshot
  missed leaves documents no change will ever correct.
"""

from __future__ import annotations

import hashlib
import json
import logging

from cdc.config import TableConfig
from cdc.errors import ConfigError, MissingColumn, TrackingNotEnabled
from cdc.mapping import TableMapper
from cdc.shapes import shape_change
from cdc.sources.base import ChangeSource, TableInfo
from publishers import control
from publishers.manager import DataManager

log = logging.getLogger("cdc.tracker")


class Describer:
    def __init__(self, table_config: TableConfig, source: ChangeSource, max_row_bytes: int) -> None:
        self.table_config = table_config
        self.table = table_config.table
        self.source = source
        self.max_row_bytes = max_row_bytes
        self.info: TableInfo | None = None
        self.mapper: TableMapper | None = None
        self.uncaptured = False  # changes may have gone uncaptured since the last description

    async def describe(self) -> str | None:
        """Describe the table again; return why its documents need a snapshot
        now (None: they do not). Raises when the table cannot be followed."""
        info = await self._resolve()
        mapper = TableMapper(self.table_config, info, self.max_row_bytes)  # the config's fault first
        await self._check_captured()
        old, self.info, self.mapper = self.info, info, mapper
        if info.left_out and (old is None or old.left_out != info.left_out):
            log.warning(
                "columns left out of the documents: names starting with @ are reserved",
                extra={"table": self.table, "columns": list(info.left_out)},
            )
        reason = None if old is None else _changed(old, info)
        if reason is not None:
            log.warning(
                "the table changed: snapshotting it again", extra={"table": self.table, "change": reason}
            )
        elif self.uncaptured:
            reason = "change tracking was off: changes may have gone uncaptured"
        self.uncaptured = False
        return reason

    @property
    def shape(self) -> str:
        """What the documents' shape depends on, as one text: the table's
        definition at the source (fingerprint, identity, published columns
        and their types, key) and the config's section and templates. Stored
        with the checkpoint (``shape``) once the documents are written in it,
        so a change made while no sidecar followed the table (DDL during a
        deploy, ``columns:`` narrowed between runs) is noticed at start-up."""
        info = self.info
        assert info is not None
        config = self.table_config
        parts = [
            info.fingerprint,
            info.identity,
            [(c.name, c.type_name) for c in info.columns],
            info.primary_key,
            config.section,
            config.partition.source,
            None if config.key is None else config.key.source,
        ]
        assert self.mapper is not None  # described with ``info``
        if self.mapper.key_template.encodes_values or config.partition.encodes_values:
            # Templates of several columns percent-encode their separators in the values
            # (cdc.templates) since 0.2: documents written before may sit under keys that
            # now read otherwise, and only a snapshot's sweep removes them (UPGRADING.md).
            parts.append("values percent-encoded")
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    async def stored_shape_differs(self, manager: DataManager, has_documents: bool) -> str | None:
        """Why the documents need a snapshot because they were written in
        another shape than the table has now (it changed while no sidecar
        followed it, or the config's columns did); None when they were not.
        No shape recorded beside documents: a cdc-sync before 0.2 wrote them,
        whose keys and values may be encoded otherwise (UPGRADING.md): they
        are snapshotted once too (the snapshot records the shape)."""
        stored, shape = await control.table_shape(manager, self.table), self.shape
        if not has_documents or stored == shape:
            return None
        if stored is None:
            reason = (
                "its documents were written by a cdc-sync older than 0.2, which did not record their shape"
            )
        else:
            reason = "the table or its config changed since its documents were written"
        log.warning(f"{reason}: snapshotting it again", extra={"table": self.table})
        return reason

    def stale(self, fingerprint: str | None) -> bool:
        """Whether the source's fingerprint of the table says it changed since described."""
        return self.info is not None and fingerprint != self.info.fingerprint

    async def _resolve(self) -> TableInfo:
        try:
            return await self.source.describe(self.table_config)
        except MissingColumn as exc:
            raise self._columns_error(exc) from exc

    def _columns_error(self, exc: MissingColumn) -> ConfigError:
        """A column the config names is not in the table: the config's line."""
        message = f"column {exc.column!r} is not in {self.table} (dropped or renamed?): {exc}"
        return self.table_config.error("columns", message)

    async def _check_captured(self) -> None:
        (status,) = await self.source.tracking_status([self.table_config])
        if status.min_valid_version is None:
            self.uncaptured = True
            raise TrackingNotEnabled(f"{self.table}: {status.detail or 'change tracking is not enabled'}")
        if not status.enabled:
            log.error("change tracking is impaired", extra={"table": self.table, "detail": status.detail})


def _changed(old: TableInfo, new: TableInfo) -> str | None:
    """Why documents written under ``old`` may not fit the table described
    as ``new``. Any change of the table's definition counts, published or
    not: a column dropped and added again under its name (in one ALTER, say)
    leaves the same TableInfo, but values no trigger wrote."""
    change = shape_change(old, new)
    if change is None and old.fingerprint != new.fingerprint:
        change = "the table's definition changed"
    return change
