"""Lookups in the publisher's catalog over an ordinary (non-replication) connection.

pgoutput names a column's type only by OID. Built-in OIDs are known; for
user-defined types (domains, enums, arrays of them, extension types) the
apply side asks here, once per OID. With ``binary: true``, a value of a type
pgsub has no binary reader for is turned into its text form here, by the
type's own receive and output functions on the publisher
(``PublisherCatalog.text_forms``, docs/apply.md). A lost connection is
reopened on the next lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import pq

from subscriber.replication import session
from subscriber.replication.errors import ConnectionLostError, ReplicationError
from subscriber.replication.lsn import Lsn, record_end


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


@dataclass(frozen=True, slots=True)
class SlotWal:
    """What a slot makes the publisher keep (pg_replication_slots, PostgreSQL 13+)."""

    retained_bytes: int  # the publisher's WAL position minus the slot's restart_lsn
    wal_status: str  # reserved | extended | unreserved | lost
    safe_wal_size: int | None  # bytes left before max_slot_wal_keep_size (None: no limit)

    @property
    def invalidated(self) -> bool:
        """The publisher removed WAL the slot needs: it can never stream again."""
        return self.wal_status == "lost"


SLOT_WAL_QUERY: Final = (
    "SELECT (CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_receive_lsn()"
    " ELSE pg_catalog.pg_current_wal_lsn() END) - restart_lsn, wal_status, safe_wal_size"
    " FROM pg_catalog.pg_replication_slots WHERE slot_name = %s"
)


def slot_wal(conn: psycopg.Connection[Any], slot: str) -> SlotWal | None:
    """The slot's retained WAL, or None when there is no such slot."""
    row = conn.execute(SLOT_WAL_QUERY, [slot]).fetchone()
    if row is None:
        return None
    retained, status, safe = row
    return SlotWal(
        max(0, int(retained or 0)), str(status or "lost"), None if safe is None else int(safe)
    )


WAL_END_QUERY: Final = (
    "SELECT CASE WHEN pg_catalog.pg_is_in_recovery()"
    " THEN pg_catalog.pg_last_wal_replay_lsn()"
    " ELSE pg_catalog.pg_current_wal_insert_lsn() END::text,"
    " pg_catalog.current_setting('wal_block_size')::int,"
    " pg_catalog.pg_size_bytes(pg_catalog.current_setting('wal_segment_size'))"
)


def wal_end(conn: psycopg.Connection[Any]) -> Lsn:
    """Where the server's WAL ends now, as a slot can confirm it: the end of its last record
    (``record_end``; on a standby, the last one replayed). A target of "caught up with every
    transaction committed so far" is this, not ``pg_current_wal_insert_lsn()``, which can lie
    past a page header that no slot reaches until more WAL is written."""
    row = conn.execute(WAL_END_QUERY).fetchone()
    assert row is not None
    position, block_size, segment_size = row
    return record_end(Lsn.parse(str(position)), int(block_size), int(segment_size))


def prepared_transactions(conn: psycopg.Connection[Any]) -> tuple[set[tuple[str, int]], Lsn]:
    """The database's prepared transactions (gid, xid) and the WAL's end after them
    (``wal_end``): a transaction missing from the set was finished below that position."""
    prepared = conn.execute(
        "SELECT gid, transaction::text::bigint FROM pg_catalog.pg_prepared_xacts"
        " WHERE database = pg_catalog.current_database()"
    ).fetchall()
    # Read after the list: whatever finished before the list was read lies below it.
    return {(str(gid), int(xid)) for gid, xid in prepared}, wal_end(conn)


# Values rendered by one statement: one result column each (a target list holds 1,664 at
# most), and a bound on the bytes sent at once.
_RENDER_VALUES: Final = 1000
_RENDER_BYTES: Final = 16 << 20


class PublisherCatalog:
    """Cached pg_type lookups on the publisher database, and the text forms of binary values."""

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

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = session.connect(self._conninfo, connect_timeout=self._timeout)
        return self._conn

    def _fetch(self, oid: int) -> PgTypeRow | None:
        try:
            return fetch_type_rows(self._connection(), [oid]).get(oid)
        except psycopg.OperationalError as exc:
            self.close()
            raise ConnectionLostError(f"cannot look up type {oid} on the publisher: {exc}") from exc

    def slot_wal(self, slot: str) -> SlotWal | None:
        """What ``slot`` makes the publisher keep (``SlotWal``); None: no such slot."""
        with self._lock:
            try:
                return slot_wal(self._connection(), slot)
            except psycopg.OperationalError as exc:
                self.close()
                raise ConnectionLostError(
                    f"cannot read slot {slot} on the publisher: {exc}"
                ) from exc

    def text_forms(self, type_oid: int, values: Sequence[bytes]) -> list[str]:
        """Each binary-format value of ``type_oid`` as the type's output function writes it.

        The values go back as parameters of that type in binary format (its receive
        function reads them), the result comes in text format (its output function):
        no cast, so ``inet`` is ``inet_out``'s text and not ``text(inet)``'s."""
        texts: list[str] = []
        with self._lock:
            start = 0
            while start < len(values):
                end, size = start, 0
                while end < len(values) and end - start < _RENDER_VALUES and size < _RENDER_BYTES:
                    size += len(values[end])
                    end += 1
                texts += self._render(type_oid, values[start:end])
                start = end
        return texts

    def _render(self, type_oid: int, values: Sequence[bytes]) -> list[str]:
        query = "SELECT " + ", ".join(f"${i}" for i in range(1, len(values) + 1))
        try:
            pgconn = self._connection().pgconn
            result = pgconn.exec_params(
                query.encode(),
                list(values),
                param_types=[type_oid] * len(values),
                param_formats=[pq.Format.BINARY] * len(values),
                result_format=pq.Format.TEXT,
            )
        except psycopg.OperationalError as exc:
            self.close()
            raise ConnectionLostError(
                f"cannot read values of type {type_oid} back on the publisher: {exc}"
            ) from exc
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = result.error_message.decode(errors="replace").strip()
            if pgconn.status == pq.ConnStatus.BAD:
                self.close()
                raise ConnectionLostError(
                    f"cannot read values of type {type_oid} back on the publisher: {message}"
                )
            raise ReplicationError(
                f"the publisher could not read back binary values of type OID {type_oid} it "
                f"sent (its receive function said: {message}); this is a pgsub bug, please "
                "report it; `binary: false` for this subscription avoids the round trip"
            )
        return [(result.get_value(0, i) or b"").decode() for i in range(len(values))]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
