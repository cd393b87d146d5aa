"""What the subscription's publications publish, read from the publisher's catalog.

For each published table: its OID, columns (the publication's column list),
row filter and size estimate, and a ``Relation`` shaped like the one
pgoutput would send (column types and the replica-identity key), so the
Delta table made for the copy is the one the leader would make.

PostgreSQL's rules (``fetch_remote_table_info`` in tablesync.c): the
column lists of all publications that publish a table must be the same, or
it is an error naming them; row filters are OR'ed, and one publication
without a filter (or FOR ALL TABLES / TABLES IN SCHEMA) means no filter.
Row filters and column lists exist from PostgreSQL 15.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from subscriber.replication.messages import Column, Relation, ReplicaIdentity
from subscriber.replication.names import qualified_name


class PublicationError(Exception):
    """The publications cannot be subscribed to as they are."""


@dataclass(frozen=True, slots=True)
class PublishedTable:
    relid: int
    schema: str
    name: str
    columns: tuple[str, ...]  # the published columns, in table order
    row_filter: str | None  # a SQL expression, or None for every row
    partitioned: bool  # a partitioned table (published via its root)
    estimated_rows: int

    @property
    def qualified_name(self) -> str:
        return qualified_name(self.schema, self.name)

    def copy_query(
        self, within: sql.Composable | None = None, columns: Sequence[str] | None = None
    ) -> sql.Composed:
        """``COPY (SELECT cols FROM [ONLY] t WHERE f) TO STDOUT`` in CSV, as tablesync does;
        ``within`` (a condition, e.g. a CTID range) is AND'ed with the row filter;
        ``columns``: some of the published columns (default: all)."""
        only = sql.SQL("") if self.partitioned else sql.SQL("ONLY ")
        query = sql.SQL("SELECT {} FROM {}{}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns or self.columns),
            only,
            sql.Identifier(self.schema, self.name),
        )
        conditions = [c for c in (within, self.row_filter and sql.SQL(self.row_filter)) if c]
        if conditions:
            where = sql.SQL(" AND ").join(sql.SQL("({})").format(c) for c in conditions)
            query = sql.SQL("{} WHERE {}").format(query, where)
        return sql.SQL("COPY ({}) TO STDOUT WITH (FORMAT csv)").format(query)

    def heap_blocks(self, conn: psycopg.Connection[Any]) -> int:
        """The table's heap size in blocks (its largest partition's, for a partitioned
        table: each partition numbers its own blocks); what CTID ranges are cut from."""
        row = conn.execute(_HEAP_BLOCKS, {"relid": self.relid}).fetchone()
        return int(row[0]) if row else 0


# Column lists (attnames) and row filters exist from PostgreSQL 15.
_TABLES = """
SELECT c.oid, p.schemaname, p.tablename, p.pubname, {columns}, {row_filter},
       c.relkind = 'p', greatest(c.reltuples, 0)::bigint
  FROM pg_catalog.pg_publication_tables p
  JOIN pg_catalog.pg_namespace n ON n.nspname = p.schemaname
  JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
 WHERE p.pubname = ANY(%s)
 ORDER BY 2, 3, 4
"""
_TABLES_15 = _TABLES.format(columns="p.attnames::text[]", row_filter="p.rowfilter")
_TABLES_14 = _TABLES.format(columns="NULL::text[]", row_filter="NULL::text")
_ALL_COLUMNS = """
SELECT a.attname FROM pg_catalog.pg_attribute a
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 ORDER BY a.attnum
"""
_DESCRIBE = """
SELECT a.attname, a.atttypid, a.atttypmod,
       coalesce(a.attnum = ANY(i.indkey::int2[]), false) OR c.relreplident = 'f', c.relreplident
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid
  LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND (
       (c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))
 WHERE c.oid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 ORDER BY a.attnum
"""
_HEAP_BLOCKS = """
SELECT greatest(pg_catalog.pg_relation_size(%(relid)s), (
         SELECT coalesce(max(pg_catalog.pg_relation_size(relid)), 0)
           FROM pg_catalog.pg_partition_tree(%(relid)s) WHERE isleaf))
       / pg_catalog.current_setting('block_size')::bigint
"""
_PUBLICATIONS = "SELECT pubname FROM pg_catalog.pg_publication WHERE pubname = ANY(%s)"


def published_tables(
    conn: psycopg.Connection[Any], publications: list[str]
) -> list[PublishedTable]:
    """Every table the publications publish, merged across publications."""
    found = {r[0] for r in conn.execute(_PUBLICATIONS, [publications]).fetchall()}
    missing = [p for p in publications if p not in found]
    if missing:
        raise PublicationError(f"publication {', '.join(missing)} does not exist on the publisher")
    query = _TABLES_15 if conn.info.server_version >= 150000 else _TABLES_14
    rows: dict[int, list[tuple[Any, ...]]] = {}
    for row in conn.execute(query, [publications]).fetchall():
        rows.setdefault(int(row[0]), []).append(row)
    tables = []
    for relid, entries in rows.items():
        _, schema, name, _, _, _, partitioned, estimate = entries[0]
        column_lists = {pub: tuple(cols) for _, _, _, pub, cols, _, _, _ in entries if cols}
        if len(set(column_lists.values())) > 1:
            raise PublicationError(
                f'cannot use different column lists for table "{schema}.{name}" in different '
                f"publications ({', '.join(sorted(column_lists))})"
            )
        if column_lists:
            columns = next(iter(column_lists.values()))
        else:
            columns = tuple(r[0] for r in conn.execute(_ALL_COLUMNS, [relid]).fetchall())
        filters = [r[5] for r in entries]
        row_filter = (
            None if any(f is None for f in filters) else " OR ".join(f"({f})" for f in filters)
        )
        tables.append(
            PublishedTable(
                relid, schema, name, columns, row_filter, bool(partitioned), int(estimate)
            )
        )
    return tables


def describe(conn: psycopg.Connection[Any], table: PublishedTable) -> Relation:
    """The Relation pgoutput would send for ``table`` (published columns, key flags)."""
    rows = conn.execute(_DESCRIBE, [table.relid]).fetchall()
    if not rows:
        raise PublicationError(f"table {table.qualified_name} no longer exists on the publisher")
    identity = ReplicaIdentity(rows[0][4])
    by_name = {r[0]: r for r in rows}
    columns = tuple(
        Column(name, int(by_name[name][1]), int(by_name[name][2]), bool(by_name[name][3]))
        for name in table.columns
        if name in by_name
    )
    return Relation(table.relid, table.schema, table.name, identity, columns)
