"""Lookups in the publisher's catalog over an ordinary (non-replication) connection.

pgoutput names a column's type only by OID. Built-in OIDs are known; for
user-defined types (domains, enums, arrays of them, extension types) the
apply side asks here, once per OID. A lost connection is reopened on the
next lookup.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Final

import psycopg

from subscriber.replication.errors import ConnectionLostError
from subscriber.replication.lsn import Lsn


@dataclass(frozen=True, slots=True)
class PgTypeRow:
    """The pg_type columns that type resolution needs."""

    oid: int
    typtype: str  # b base, d domain, e enum, c composite, r range, m multirange, p pseudo
    basetype: int
    typtypmod: int
    elem: int
    category: str


PG_TYPE_QUERY: Final = (
    "SELECT oid, typtype, typbasetype, typtypmod, typelem, typcategory"
    " FROM pg_catalog.pg_type WHERE oid = ANY(%s)"
)


def fetch_type_rows(conn: psycopg.Connection[Any], oids: list[int]) -> dict[int, PgTypeRow]:
    rows = conn.execute(PG_TYPE_QUERY, [oids]).fetchall()
    return {
        int(r[0]): PgTypeRow(int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), str(r[5]))
        for r in rows
    }


def prepared_transactions(conn: psycopg.Connection[Any]) -> tuple[set[tuple[str, int]], Lsn]:
    """The database's prepared transactions (gid, xid) and the WAL insert position after
    them: a transaction missing from the set was finished below that position."""
    prepared = conn.execute(
        "SELECT gid, transaction::text::bigint FROM pg_catalog.pg_prepared_xacts"
        " WHERE database = pg_catalog.current_database()"
    ).fetchall()
    # Read after the list: whatever finished before the list was read lies below it.
    row = conn.execute(
        "SELECT CASE WHEN pg_catalog.pg_is_in_recovery()"
        " THEN pg_catalog.pg_last_wal_replay_lsn()"
        " ELSE pg_catalog.pg_current_wal_insert_lsn() END::text"
    ).fetchone()
    assert row is not None
    return {(str(gid), int(xid)) for gid, xid in prepared}, Lsn.parse(str(row[0]))


class PublisherCatalog:
    """Cached pg_type lookups on the publisher database."""

    def __init__(self, conninfo: str, *, connect_timeout: int = 30) -> None:
        self._conninfo = conninfo
        self._timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._cache: dict[int, PgTypeRow | None] = {}
        self._lock = threading.Lock()

    def type_row(self, oid: int) -> PgTypeRow | None:
        with self._lock:
            if oid not in self._cache:
                self._cache[oid] = self._fetch(oid)
            return self._cache[oid]

    def _fetch(self, oid: int) -> PgTypeRow | None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self._conninfo, autocommit=True, connect_timeout=self._timeout
                )
            return fetch_type_rows(self._conn, [oid]).get(oid)
        except psycopg.OperationalError as exc:
            self.close()
            raise ConnectionLostError(f"cannot look up type {oid} on the publisher: {exc}") from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
