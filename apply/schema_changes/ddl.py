"""Schema changes at their LSN: the DDL messages of pgsub's event triggers on the publisher.
Pure.

pgoutput carries no DDL: after an ``ALTER TABLE`` it sends the table's new
column list (a RELATION message) before its next change, which cannot tell
a renamed column from one dropped and another added. ``pgsub
publisher-setup`` installs two event triggers on the publisher
(``publisher_setup_sql``) that emit, inside the altering transaction, a
transactional logical decoding message (prefix ``pgsub-ddl``) with a
published table's columns and their attribute numbers: one before the
``ALTER TABLE`` runs (``before``: every published table the statement's
text names, a superset) and one after it (``after``: each table it
altered). The two, paired by the table's OID within the transaction, say
exactly what changed (``diff``): an attribute number that kept its place
under another name was renamed, one gone was dropped, one whose type
changed was retyped, a new one was added.

The apply worker follows each change at its position in the stream: it
applies the batch's transactions before the altering one first, then the
change to the Delta table (``apply.delta.spark.ddl``), then the rest; the
images sent before the change within its transaction are read with the
new names (``renamed_work``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Final

from apply.columns.columnar import to_arrow
from apply.columns.schema import TargetColumn
from apply.columns.typemap import TypeLookup, resolve
from apply.core.batch import TableChange, TableWork
from apply.core.errors import ApplyError
from apply.core.transactions import MessageChange, RemoteTransaction, RowChange
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation
from subscriber.replication.names import qualified_name

DDL_PREFIX: Final = "pgsub-ddl"
VERSION: Final = 1


class DdlMessageError(ApplyError):
    """A ``pgsub-ddl`` message pgsub cannot read."""


@dataclass(frozen=True, slots=True)
class ShapeColumn:
    attnum: int
    name: str
    type: str  # format_type(): "integer", "character varying(20)", ...
    type_oid: int
    typmod: int
    has_default: bool = False
    # The value every row had when the column was added (PostgreSQL's "fast default", as
    # an array literal of one element): rows the publisher never sends again.
    missing: str | None = None

    def missing_value(self) -> str | None:
        """``missing``'s one element as text (None: none, or NULL)."""
        if self.missing is None:
            return None
        inner = self.missing[1:-1]
        if inner.startswith('"'):
            return inner[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        return None if inner == "NULL" else inner


@dataclass(frozen=True, slots=True)
class TableShape:
    """A table's live columns, as the event trigger read them from pg_attribute."""

    relid: int
    namespace: str
    name: str
    columns: tuple[ShapeColumn, ...]

    @property
    def qualified_name(self) -> str:
        return qualified_name(self.namespace, self.name)

    def by_attnum(self) -> dict[int, ShapeColumn]:
        return {c.attnum: c for c in self.columns}


@dataclass(frozen=True, slots=True)
class DdlEvent:
    event: str  # "before" or "after" the ALTER TABLE
    tag: str
    shape: TableShape


def parse(content: bytes) -> DdlEvent:
    """A ``pgsub-ddl`` message's content."""
    try:
        body = json.loads(content)
        if int(body["version"]) != VERSION:
            raise DdlMessageError(
                f"a {DDL_PREFIX} message of version {body['version']}; this pgsub reads "
                f"version {VERSION}: run `pgsub publisher-setup` of this version again"
            )
        columns = tuple(
            ShapeColumn(
                int(c["attnum"]),
                str(c["name"]),
                str(c["type"]),
                int(c["type_oid"]),
                int(c["typmod"]),
                bool(c.get("has_default", False)),
                None if c.get("missing") is None else str(c["missing"]),
            )
            for c in body["columns"]
        )
        shape = TableShape(int(body["relid"]), str(body["schema"]), str(body["table"]), columns)
        return DdlEvent(str(body["event"]), str(body["tag"]), shape)
    except (ValueError, KeyError, TypeError) as exc:
        raise DdlMessageError(f"a {DDL_PREFIX} message pgsub cannot read: {exc}") from exc


@dataclass(frozen=True, slots=True)
class SchemaChange:
    """What one ALTER TABLE did to a published table's columns."""

    table: str  # schema.name
    relid: int
    lsn: Lsn  # the message's: where in the stream the change happened
    renamed: tuple[tuple[str, str], ...] = ()  # (old name, new name)
    dropped: tuple[str, ...] = ()
    retyped: tuple[tuple[str, str, str], ...] = ()  # (new name, old type, new type)
    added: tuple[str, ...] = ()
    after: TableShape = TableShape(0, "", "", ())  # the table's columns after it

    def __bool__(self) -> bool:
        return bool(self.renamed or self.dropped or self.retyped or self.added)

    def filled(self) -> list[ShapeColumn]:
        """The added columns whose existing rows took a value (their default), which the
        publisher does not send: ``missing`` tells it, or (a volatile default) nothing."""
        added = set(self.added)
        return [c for c in self.after.columns if c.name in added and c.has_default]

    def relation(self) -> Relation:
        """A stand-in for the table's relation, to ask whether a worker applies it."""
        from subscriber.replication.messages import ReplicaIdentity

        namespace, _, name = self.table.partition(".")
        return Relation(self.relid, namespace, name, ReplicaIdentity.DEFAULT, ())


def diff(before: TableShape, after: TableShape, lsn: Lsn) -> SchemaChange:
    """What changed from ``before`` to ``after``, by attribute number."""
    old, new = before.by_attnum(), after.by_attnum()
    renamed = tuple(
        (old[n].name, new[n].name)
        for n in sorted(old.keys() & new.keys())
        if old[n].name != new[n].name
    )
    retyped = tuple(
        (new[n].name, old[n].type, new[n].type)
        for n in sorted(old.keys() & new.keys())
        if old[n].type != new[n].type
    )
    dropped = tuple(old[n].name for n in sorted(old.keys() - new.keys()))
    added = tuple(new[n].name for n in sorted(new.keys() - old.keys()))
    return SchemaChange(
        after.qualified_name, after.relid, lsn, renamed, dropped, retyped, added, after
    )


def schema_changes(tx: RemoteTransaction) -> list[SchemaChange]:
    """The schema changes the ``pgsub-ddl`` messages of ``tx`` describe, in order; an
    ``after`` without its ``before`` (a table the statement did not name as the trigger
    looks for it) is a change whose renames are unknown, and is left out."""
    found: list[SchemaChange] = []
    before: dict[int, TableShape] = {}
    for change in tx.changes:
        if not isinstance(change, MessageChange) or change.prefix != DDL_PREFIX:
            continue
        event = parse(change.content)
        if event.event == "before":
            before[event.shape.relid] = event.shape
        elif event.shape.relid in before:
            found.append(diff(before.pop(event.shape.relid), event.shape, change.lsn))
    return [change for change in found if change]


@dataclass(frozen=True, slots=True)
class NewColumns:
    """What the Delta table needs to know of a change's new columns."""

    types: dict[str, str]  # the Spark type of each retyped column and each one in ``fills``
    fills: dict[str, object]  # an added column's value in the rows there were (Python)
    unknown: tuple[str, ...]  # added with a volatile default (values never sent), or unread


def new_columns(change: SchemaChange, lookup: TypeLookup) -> NewColumns:
    """The types and values ``change``'s retyped and filled columns take in Delta."""
    retyped = {name for name, _, _ in change.retyped}
    filled = {c.name: c for c in change.filled()}
    types = {
        c.name: resolve(c.type_oid, c.typmod, lookup)
        for c in change.after.columns
        if c.name in retyped or c.name in filled
    }
    fills: dict[str, object] = {}
    unknown = []
    for name, column in filled.items():
        text = column.missing_value()
        try:
            if column.missing is None:
                raise ValueError("computed row by row")
            value = None if text is None else to_arrow([text.encode()], types[name], name)
        except (ApplyError, ValueError):
            unknown.append(name)  # never sent, or not a value pgsub reads
            continue
        fills[name] = None if value is None else value[0].as_py()
    return NewColumns(
        {name: TargetColumn(name, kind).spark_type for name, kind in types.items()},
        fills,
        tuple(unknown),
    )


def renamed_work(work: TableWork, change: SchemaChange) -> TableWork:
    """``work`` with the images sent before ``change`` read under the new column names: a
    relation that still has a renamed column's old name (and not its new one) is renamed."""
    if not change.renamed:
        return work
    names = dict(change.renamed)
    renamed: dict[int, Relation] = {}

    def rename(relation: Relation) -> Relation:
        own = {c.name for c in relation.columns}
        if not any(old in own and new not in own for old, new in names.items()):
            return relation
        if id(relation) not in renamed:
            columns = tuple(replace(c, name=names.get(c.name, c.name)) for c in relation.columns)
            renamed[id(relation)] = replace(relation, columns=columns)
        return renamed[id(relation)]

    changes = [
        TableChange(entry.tx, replace(row, relation=rename(row.relation)), entry.position)
        if isinstance(row := entry.change, RowChange)
        else entry
        for entry in work.changes
    ]
    return TableWork(work.relation, changes)


def publisher_setup_sql() -> str:
    """The SQL ``pgsub publisher-setup`` runs on the publisher (``--print`` prints it): the
    schema ``pgsub``, four functions and two event triggers. Run again, it replaces them."""
    return _SETUP


_SETUP: Final = """\
-- pgsub: schema changes of published tables as logical decoding messages (docs/tables.md,
-- "Schema changes"). Needs a superuser (event triggers); run again to update.
CREATE SCHEMA IF NOT EXISTS pgsub;

CREATE OR REPLACE FUNCTION pgsub.table_shape(relid oid, event text, tag text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog AS $fn$
  SELECT jsonb_build_object(
    'version', 1, 'event', event, 'tag', tag, 'relid', c.oid,
    'schema', n.nspname, 'table', c.relname,
    'columns', COALESCE((
      SELECT jsonb_agg(jsonb_build_object(
        'attnum', a.attnum, 'name', a.attname, 'type', format_type(a.atttypid, a.atttypmod),
        'type_oid', a.atttypid, 'typmod', a.atttypmod, 'has_default', a.atthasdef,
        'missing', CASE WHEN a.atthasmissing THEN a.attmissingval::text END) ORDER BY a.attnum)
      FROM pg_attribute a
      WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '[]'::jsonb)
  )::text
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE c.oid = relid
$fn$;

-- Whether a statement (lowered, and split into its words) names a table: as a word, or
-- for a name that is not one simple word, anywhere in it.
CREATE OR REPLACE FUNCTION pgsub.names(statement text, words text[], relname name)
RETURNS boolean LANGUAGE sql IMMUTABLE SET search_path = pg_catalog AS $fn$
  SELECT lower(relname) = ANY (words)
      OR (lower(relname) !~ '^[a-z_][a-z0-9_$]*$' AND strpos(statement, lower(relname)) > 0)
$fn$;

-- Before an ALTER TABLE: the columns of each published table its text names (or names
-- a partitioned table it is a partition of).
CREATE OR REPLACE FUNCTION pgsub.ddl_before() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $fn$
DECLARE
  r record;
  statement text := lower(current_query());
  words text[] := regexp_split_to_array(lower(current_query()), '[^a-z0-9_$]+');
BEGIN
  FOR r IN
    SELECT DISTINCT c.oid
    FROM pg_publication_tables pt
    JOIN pg_namespace n ON n.nspname = pt.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
    WHERE pgsub.names(statement, words, c.relname)
       OR EXISTS (SELECT 1 FROM pg_partition_ancestors(c.oid) up
                  JOIN pg_class uc ON uc.oid = up.relid
                  WHERE pgsub.names(statement, words, uc.relname))
  LOOP
    PERFORM pg_logical_emit_message(true, 'pgsub-ddl', pgsub.table_shape(r.oid, 'before', tg_tag));
  END LOOP;
EXCEPTION WHEN OTHERS THEN  -- never in the way of the publisher's DDL
  RAISE WARNING 'pgsub: no schema change message: %', SQLERRM;
END
$fn$;

-- After it: the columns of each published table it altered, and of their partitions.
CREATE OR REPLACE FUNCTION pgsub.ddl_after() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $fn$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT DISTINCT c.oid
    FROM pg_event_trigger_ddl_commands() d
    CROSS JOIN LATERAL (
      SELECT d.objid AS relid UNION SELECT tree.relid FROM pg_partition_tree(d.objid) tree
    ) altered
    JOIN pg_class c ON c.oid = altered.relid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_publication_tables pt ON pt.schemaname = n.nspname AND pt.tablename = c.relname
    WHERE d.classid = 'pg_catalog.pg_class'::regclass
  LOOP
    PERFORM pg_logical_emit_message(true, 'pgsub-ddl', pgsub.table_shape(r.oid, 'after', tg_tag));
  END LOOP;
EXCEPTION WHEN OTHERS THEN
  RAISE WARNING 'pgsub: no schema change message: %', SQLERRM;
END
$fn$;

REVOKE ALL ON FUNCTION pgsub.ddl_before(), pgsub.ddl_after() FROM PUBLIC;

DROP EVENT TRIGGER IF EXISTS pgsub_ddl_before;
CREATE EVENT TRIGGER pgsub_ddl_before ON ddl_command_start WHEN TAG IN ('ALTER TABLE')
  EXECUTE FUNCTION pgsub.ddl_before();
DROP EVENT TRIGGER IF EXISTS pgsub_ddl_after;
CREATE EVENT TRIGGER pgsub_ddl_after ON ddl_command_end WHEN TAG IN ('ALTER TABLE')
  EXECUTE FUNCTION pgsub.ddl_after();
"""
