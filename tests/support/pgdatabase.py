"""A fresh database in a test cluster, with the few helpers tests need."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from subscriber.replication.catalog import wal_end
from subscriber.replication.lsn import Lsn
from tests.support.pgcluster import PgCluster, wait_until

_names = itertools.count(1)


@dataclass
class PgDatabase:
    """A database created for one test (or module) and dropped after it."""

    cluster: PgCluster
    name: str

    @classmethod
    def create(cls, cluster: PgCluster, prefix: str = "t") -> PgDatabase:
        name = f"{prefix}_{next(_names)}"
        with cluster.connect() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return cls(cluster, name)

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(self.name)

    @property
    def replication_dsn(self) -> str:
        return self.cluster.dsn(self.name, replication="database")

    @property
    def major(self) -> int:
        return self.cluster.major

    def connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(self.dsn, autocommit=True)

    def execute(self, query: str, params: Sequence[Any] | None = None) -> None:
        """Run one or more statements, each in its own transaction (autocommit)."""
        with self.connect() as conn:
            conn.execute(query, params)

    def fetch(self, query: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            return conn.execute(query, params).fetchall()

    def fetchval(self, query: str, params: Sequence[Any] | None = None) -> Any:
        rows = self.fetch(query, params)
        return rows[0][0] if rows else None

    def wal_end(self) -> Lsn:
        """Where the WAL ends now, as a slot can confirm it (``catalog.wal_end``): the target
        of "caught up with everything committed so far"."""
        with self.connect() as conn:
            return wal_end(conn)

    def set_config(self, name: str, value: str) -> None:
        """A per-database setting (e.g. logical_decoding_work_mem) for new sessions."""
        self.execute(
            sql.SQL("ALTER DATABASE {} SET {} = {}")
            .format(sql.Identifier(self.name), sql.Identifier(name), sql.Literal(value))
            .as_string()
        )

    def slots(self) -> list[str]:
        return [
            r[0]
            for r in self.fetch(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s ORDER BY 1",
                [self.name],
            )
        ]

    def confirmed_flush_lsn(self, slot: str) -> str | None:
        return self.fetchval(  # type: ignore[no-any-return]
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            [slot],
        )

    def drop(self) -> None:
        with self.cluster.connect() as conn:
            if self.cluster.major >= 14:
                # Subscriptions first: their DROP removes the remote slots.
                for (sub,) in conn.execute(
                    "SELECT subname FROM pg_subscription s JOIN pg_database d"
                    " ON d.oid = s.subdbid WHERE d.datname = %s",
                    [self.name],
                ).fetchall():
                    with psycopg.connect(self.dsn, autocommit=True) as db:
                        db.execute(
                            sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(
                                sql.Identifier(str(sub))
                            )
                        )
                        db.execute(
                            sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(
                                sql.Identifier(str(sub))
                            )
                        )
                        db.execute(sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(str(sub))))
            # A prepared transaction left behind would hold up every slot created in the
            # cluster after it (a consistent snapshot waits for it) and the DROP DATABASE.
            with psycopg.connect(self.dsn, autocommit=True) as db:
                for (gid,) in db.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                ).fetchall():
                    db.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE database = %s AND active_pid IS NOT NULL",
                [self.name],
            )

            def slots_dropped() -> bool:
                try:
                    conn.execute(
                        "SELECT pg_drop_replication_slot(slot_name)"
                        " FROM pg_replication_slots WHERE database = %s",
                        [self.name],
                    )
                except psycopg.errors.ObjectInUse:
                    return False
                return True

            wait_until(slots_dropped, timeout=30, what=f"slots of {self.name} to be dropped")
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )
