"""The row trigger that keeps a tracked table's net-change table (``pg_tracking``).

What it records is unchanged since 0.1 (DESIGN.md §2): per changed primary key
one net row with the operation, the writing transaction's id as the version,
the version of the row's creation, and per column the version of its last
change; a primary-key update is a delete of the old key and an insert of the
new one; values are compared as text, as they are published (1.0 -> 1.00 is
a change).

What 0.4 changed is its cost, which the writing applications pay: pgbench
TPC-B (three tracked tables, one row updated in each per transaction) ran at
0.55-0.73x the throughput of the same run without tracking (issue 17). Per
updated row, measured by same-run comparisons of variants (the
body of each in a DO loop of 30,000 single-row updates, the backend's CPU
time; and in pgbench, the server's CPU per transaction), the 0.3 body spent:

- ~26 µs on the changed columns, found by ``jsonb_each_text(to_jsonb(NEW))``
  with ``to_jsonb(OLD) ->> key`` in the filter: a set-returning function and
  an SPI query per row, and ``to_jsonb(OLD)`` built again for every column;
- ~6 µs comparing the key as text twice;
- ~36 µs on the upsert itself (INSERT ... ON CONFLICT DO UPDATE), which an
  append-only log would cut to ~14 µs: but in pgbench the two cost about the
  same (+367 vs +375 µs of server CPU per transaction, same run), as the
  changed columns dominate, and an append-only log moves the net change to
  every read and needs compaction; so the net table stays.

So the body now compares the key once and finds the changed columns with
plain expressions over ``to_jsonb`` of each row built once (~14 µs): one
``CASE`` per column the table had when tracking was enabled, named in the
function. A column dropped since reads NULL on both sides (not changed); a
column added or renamed since is not named, so the rest of the two rows
(``jsonb - known``) is compared as text, and only when it differs are the
columns compared one by one as before. ``cdc tracking enable`` run again
names the current columns.

The whole function, same run (docs/POSTGRES.md §5): 99-107 µs of backend CPU
per updated row against 116-128 µs for 0.3's and 32 µs untracked; pgbench
TPC-B 0.67x the untracked tps against 0.64x (server CPU per transaction
1,175 µs against 1,258 µs, 691 µs untracked). What remains is mostly the
upsert (~36 µs) and calling the function at all (~15 µs, its fixed
search_path and the statement's notify included).
"""

from __future__ import annotations

from psycopg import sql

# jsonb_build_object takes at most 100 arguments (FUNC_MAX_ARGS): 50 columns each.
_PAIRS_PER_CALL = 50

_BODY = """
declare
    _cdc_version bigint := pg_current_xact_id()::text::bigint;
    _cdc_old jsonb;
    _cdc_new jsonb;
    _cdc_changed jsonb;
begin
    if TG_OP = 'UPDATE' and row({old})::text = row({new})::text then
        _cdc_old := to_jsonb(OLD);
        _cdc_new := to_jsonb(NEW);
        if (_cdc_new - {known})::text = (_cdc_old - {known})::text then
            _cdc_changed := {changed};
        else
            -- a column added or renamed since tracking was enabled: compare every column
            select coalesce(jsonb_object_agg(n.key, _cdc_version), '{{}}') into _cdc_changed
              from jsonb_each_text(_cdc_new) as n
             where n.value is distinct from _cdc_old ->> n.key;
        end if;
        insert into {net} as e ({keys}, op, version, creation_version, column_versions, changed_at)
        values ({new}, 'U', _cdc_version, 0, _cdc_changed, now())
        on conflict ({keys}) do update set op = 'U', version = _cdc_version,
            column_versions = e.column_versions || _cdc_changed, changed_at = now();
        return null;
    end if;
    if TG_OP <> 'INSERT' then  -- a DELETE, or an UPDATE of the primary key: the old key is gone
        insert into {net} as e ({keys}, op, version, creation_version, column_versions, changed_at)
        values ({old}, 'D', _cdc_version, 0, '{{}}', now())
        on conflict ({keys}) do update set op = 'D', version = _cdc_version, changed_at = now();
    end if;
    if TG_OP <> 'DELETE' then  -- an INSERT, or an UPDATE of the primary key: the new key is created
        insert into {net} as e ({keys}, op, version, creation_version, column_versions, changed_at)
        values ({new}, 'I', _cdc_version, _cdc_version, '{{}}', now())
        on conflict ({keys}) do update set op = 'I', version = _cdc_version,
            creation_version = _cdc_version, column_versions = '{{}}', changed_at = now();
    end if;
    return null;
end"""


def _record(name: str, key: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(", ").join(sql.SQL(name + ".{}").format(sql.Identifier(k)) for k in key)


def _changed(columns: tuple[str, ...]) -> sql.Composable:
    """``{column: version}`` of the named columns whose text differs, as one expression."""
    if not columns:
        return sql.SQL("'{}'::jsonb")
    calls = []
    for start in range(0, len(columns), _PAIRS_PER_CALL):
        pairs = sql.SQL(", ").join(
            sql.SQL(
                "{name}, case when _cdc_new ->> {name} is distinct from _cdc_old ->> {name} then _cdc_version end"
            ).format(name=sql.Literal(c))
            for c in columns[start : start + _PAIRS_PER_CALL]
        )
        calls.append(sql.SQL("jsonb_build_object({})").format(pairs))
    return sql.SQL("jsonb_strip_nulls({})").format(sql.SQL(" || ").join(calls))


def capture_body(schema: str, net: str, key: tuple[str, ...], columns: tuple[str, ...]) -> sql.Composed:
    """The row trigger's plpgsql body for a table with primary key ``key`` and
    ``columns`` (every column it has now: the ones compared one by one)."""
    known = sql.SQL("{}::text[]").format(sql.Literal("{" + ",".join(_array_item(c) for c in columns) + "}"))
    return sql.SQL(_BODY).format(
        net=sql.Identifier(schema, net),
        keys=sql.SQL(", ").join(map(sql.Identifier, key)),
        old=_record("OLD", key),
        new=_record("NEW", key),
        known=known,
        changed=_changed(columns),
    )


def _array_item(name: str) -> str:
    """A column name as an element of a text[] literal: always quoted, so that
    commas, braces, spaces and NULL stay part of the name."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
