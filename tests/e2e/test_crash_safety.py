"""kill -9 at named points of a batch, restart: no loss, no duplicates (docs/architecture.md)."""

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pytest

from apply.history.changelog import OP
from apply.history.stamps import DELETED
from apply.history.versions import CURRENT, VALID_FROM
from tests.support.daemon import DaemonProcess, wait_confirmed, write_config
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.e2e

KEYED_AND_BAG = """
CREATE TABLE keyed (id int PRIMARY KEY, v text);
CREATE TABLE bag (a int, b text); ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE keyed, bag
"""


def assert_keyed_and_bag_equal(publisher: PgDatabase, spark: Any, warehouse: Path | str) -> None:
    with publisher.connect() as conn:
        assert_delta_equals_publisher(
            conn, "public.keyed", spark, f"{warehouse}/public/keyed", ("id",)
        )
        assert_delta_equals_publisher(conn, "public.bag", spark, f"{warehouse}/public/bag")


WORKLOAD = """
INSERT INTO keyed SELECT g, 'v' || g FROM generate_series(1, 200) g;
INSERT INTO bag SELECT g % 10, 'dup' FROM generate_series(1, 100) g;
BEGIN;
UPDATE keyed SET v = 'changed' WHERE id % 3 = 0;
DELETE FROM keyed WHERE id > 190;
INSERT INTO bag SELECT g % 10, 'dup' FROM generate_series(1, 50) g;
DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag WHERE a = 1 LIMIT 3);
COMMIT;
"""


AFTER_CRASH = """
INSERT INTO bag VALUES (42, 'after');
UPDATE keyed SET v = 'after' WHERE id = 1;
"""


AFTER_SECOND_CRASH = """
DELETE FROM bag WHERE a = 42;
UPDATE keyed SET v = 'after again' WHERE id = 2;
DELETE FROM keyed WHERE id = 3;
"""


# The keyed table as a change log: every change of the workloads once (no copy).
LOGGED = Counter(
    [("insert", i) for i in range(1, 201)]
    + [("update", i) for i in range(3, 199, 3)]
    + [("delete", i) for i in range(191, 201)]
    + [("update", 1), ("update", 2), ("delete", 3)]
)


@pytest.mark.parametrize(
    "kept", ["default", "deletion-vectors", "changelog", "soft_delete", "scd2", "object-store"]
)
def test_kills_at_each_step_of_a_batch_then_restart(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
    kept: str,
    request: pytest.FixtureRequest,
) -> None:
    """Killed after one table's commit, then (replaying that batch) before its checkpoint,
    then before the flush is confirmed upstream: the survivor has every row once. With
    deletion vectors on, the keyed table's batches are pgsub's own commits
    (apply/delta/writer/vector_write.py); as a change log (history: changelog), every change is
    one row of it; kept with soft deletes (history: soft_delete), every row once, the
    deleted ones marked (the keyless bag stays a mirror); kept as versions (history:
    scd2), every committed version once; in an object store (a bucket of versitygw, a real
    S3 gateway), the same as on a local disk."""
    publisher.execute(KEYED_AND_BAG)
    warehouse: Path | str = tmp_path / "warehouse"
    storage = None
    if kept == "object-store":
        warehouse = request.getfixturevalue("s3_warehouse")
        storage = request.getfixturevalue("s3_server")
    config = tmp_path / "pgsub.yaml"
    features: dict[str, Any] = {
        "deletion_vectors": "always" if kept == "deletion-vectors" else "auto"
    }
    history: dict[str, Any] = {
        "tables": {"public.keyed": "changelog" if kept == "changelog" else "mirror"}
    }
    if kept in ("soft_delete", "scd2"):  # every table: the keyless bag stays a mirror
        history = {"mode": kept}
    port = write_config(
        config,
        publisher,
        warehouse,
        batch={"max_delay": "2s"},
        table_features=features,
        history=history,
        storage=storage,
    )

    doomed = daemons(config, port, "apply.after_table_write")  # creates the slot
    doomed.wait_ready()
    publisher.execute(WORKLOAD)  # one batch: its first table's commit is the kill
    assert doomed.wait_exit() == -9, doomed.logs()
    # More transactions before each restart: the replayed batch ends at a new LSN, so
    # Delta's idempotent-write id alone cannot refuse it; the per-table LSN must.
    publisher.execute(AFTER_CRASH)
    doomed = daemons(config, port, "apply.before_checkpoint")
    assert doomed.wait_exit() == -9, doomed.logs()
    publisher.execute(AFTER_SECOND_CRASH)
    doomed = daemons(config, port, "apply.before_flush_report")
    assert doomed.wait_exit() == -9, doomed.logs()

    survivor = daemons(config, port)
    survivor.wait_ready()
    wait_confirmed(publisher)
    assert survivor.terminate() == 0, survivor.logs()

    local = tmp_path / "warehouse"  # where the kinds below keep it
    if kept == "soft_delete":
        with publisher.connect() as conn:
            bag = str(local / "public" / "bag")
            assert_delta_equals_publisher(conn, "public.bag", spark, bag)
            published = dict(conn.execute("SELECT id, v FROM keyed").fetchall())
        kept_rows = deltalake.DeltaTable(str(local / "public" / "keyed")).to_pyarrow_table()
        ids = kept_rows["id"].to_pylist()
        # Every row once, deleted or not; 191-200 came and went within the first batch.
        assert len(ids) == len(set(ids)) == 190
        alive = {r["id"]: r["v"] for r in kept_rows.to_pylist() if not r[DELETED]}
        assert alive == published
        assert set(ids) - set(alive) == {3}
        return
    if kept == "scd2":
        assert_scd2_kept_once(publisher, spark, local)
        return
    if kept != "changelog":
        assert_keyed_and_bag_equal(publisher, spark, warehouse)
        return
    with publisher.connect() as conn:
        assert_delta_equals_publisher(conn, "public.bag", spark, str(local / "public" / "bag"))
    logged = deltalake.DeltaTable(str(local / "public" / "keyed")).to_pyarrow_table()
    assert Counter(zip(logged[OP].to_pylist(), logged["id"].to_pylist(), strict=True)) == LOGGED


def assert_scd2_kept_once(publisher: PgDatabase, spark: Any, warehouse: Path) -> None:
    """Each committed version of the keyed table once: the workload is one transaction (190
    versions; 191-200 came and went in it, never seen), then 1 and 2 updated after."""
    with publisher.connect() as conn:
        assert_delta_equals_publisher(conn, "public.bag", spark, str(warehouse / "public" / "bag"))
        published = dict(conn.execute("SELECT id, v FROM keyed").fetchall())
    kept = deltalake.DeltaTable(str(warehouse / "public" / "keyed")).to_pyarrow_table()
    versions = kept.to_pylist()
    starts = [(r["id"], r[VALID_FROM]) for r in versions]
    assert len(starts) == len(set(starts)) == 190 + 2
    assert {r["id"]: r["v"] for r in versions if r[CURRENT]} == published
    assert sum(1 for r in versions if r[CURRENT]) == len(published)
    assert [r[CURRENT] for r in versions if r["id"] == 3] == [False]  # deleted after


BIG = """
BEGIN;
INSERT INTO keyed SELECT g, 'v' || g FROM generate_series(1, 3000) g;
SAVEPOINT a;
UPDATE keyed SET v = 'undone' WHERE id <= 1000;
ROLLBACK TO SAVEPOINT a;
INSERT INTO bag SELECT g % 10, 'dup' FROM generate_series(1, 1500) g;
UPDATE keyed SET v = 'changed' WHERE id % 3 = 0;
DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag WHERE a = 1 LIMIT 30);
COMMIT;
"""


@pytest.mark.parametrize(
    ("streaming", "failpoints"),
    [
        ("on", ["apply.after_piece=2", "apply.after_table_write"]),
        ("off", ["apply.after_piece"]),
    ],
)
def test_kill_inside_a_large_transaction_then_resume_with_other_pieces(
    streaming: str,
    failpoints: list[str],
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """Killed between the pieces of a spooled transaction (streamed: then again after a
    table's commit in the replay), restarted with another piece size each time: each table
    resumes where its last piece ended, without loss or duplicates."""
    publisher.execute(KEYED_AND_BAG)
    publisher.set_config("logical_decoding_work_mem", "64kB")
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    settings: dict[str, Any] = {"streaming": streaming, "spool_dir": str(tmp_path / "spool")}
    port = write_config(config, publisher, warehouse, batch={"max_changes": 1000}, **settings)
    first, *then = failpoints
    doomed = daemons(config, port, first)  # creates the slot
    doomed.wait_ready()
    publisher.execute(BIG)
    assert doomed.wait_exit() == -9, doomed.logs()
    publisher.execute(AFTER_CRASH)
    for failpoint, piece in zip(then, (800, 600), strict=False):
        port = write_config(config, publisher, warehouse, batch={"max_changes": piece}, **settings)
        doomed = daemons(config, port, failpoint)
        assert doomed.wait_exit() == -9, doomed.logs()

    port = write_config(config, publisher, warehouse, batch={"max_changes": 700}, **settings)
    survivor = daemons(config, port)
    survivor.wait_ready()
    wait_confirmed(publisher)
    assert survivor.terminate() == 0, survivor.logs()
    assert "transaction piece applied" in survivor.logs()

    assert_keyed_and_bag_equal(publisher, spark, warehouse)


KEYED_ONLY = """
BEGIN;
UPDATE keyed SET v = 'changed' WHERE id % 3 = 0;
DELETE FROM keyed WHERE id % 7 = 0 AND id % 3 <> 0;
INSERT INTO keyed SELECT g, 'new' FROM generate_series(3001, 3600) g;
INSERT INTO other SELECT g, 'o' FROM generate_series(1, 2000) g;
COMMIT;
"""


def test_kill_inside_a_staged_transaction_then_restart(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """A large transaction on keyed tables lands in one commit per table: killed after the
    first table's commit, then (replaying it with another piece size) before the
    checkpoint, a committed table skips it and the other applies it, once."""
    publisher.execute(
        "CREATE TABLE keyed (id int PRIMARY KEY, v text);"
        "CREATE TABLE other (id int PRIMARY KEY, v text);"
        "CREATE PUBLICATION pub FOR TABLE keyed, other"
    )
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    settings: dict[str, Any] = {"spool_dir": str(tmp_path / "spool")}
    port = write_config(config, publisher, warehouse, batch={"max_changes": 1000}, **settings)
    first = daemons(config, port)
    first.wait_ready()
    publisher.execute("INSERT INTO keyed SELECT g, 'v' || g FROM generate_series(1, 3000) g")
    wait_confirmed(publisher)
    assert first.terminate() == 0, first.logs()

    publisher.execute(KEYED_ONLY)  # each key changed once: staged, one MERGE per table
    logs = ""
    for failpoint, piece, after in (
        ("apply.after_table_write", 1000, "UPDATE keyed SET v = 'after' WHERE id = 1"),
        ("apply.before_checkpoint", 700, "UPDATE keyed SET v = 'again' WHERE id = 2"),
    ):
        port = write_config(config, publisher, warehouse, batch={"max_changes": piece}, **settings)
        doomed = daemons(config, port, failpoint)
        assert doomed.wait_exit() == -9, doomed.logs()
        logs += doomed.logs()
        publisher.execute(after)

    port = write_config(config, publisher, warehouse, batch={"max_changes": 500}, **settings)
    survivor = daemons(config, port)
    survivor.wait_ready()
    wait_confirmed(publisher)
    assert survivor.terminate() == 0, survivor.logs()
    assert "transaction piece applied" not in logs + survivor.logs()

    with publisher.connect() as conn:
        for table in ("keyed", "other"):
            assert_delta_equals_publisher(
                conn, f"public.{table}", spark, str(warehouse / "public" / table), ("id",)
            )


def staged_gids(warehouse: Path) -> list[str]:
    """Prepared transactions staged in the state store (read by delta-rs)."""
    import deltalake

    path = warehouse / "_pgsub" / "prepared"
    if not path.exists():
        return []
    rows = deltalake.DeltaTable(str(path)).to_pyarrow_table(columns=["gid"]).to_pylist()
    return sorted({row["gid"] for row in rows})


PREPARE = """
BEGIN;
INSERT INTO keyed SELECT g, 'p' || g FROM generate_series(1, 200) g;
INSERT INTO bag SELECT g % 10, 'prepared' FROM generate_series(1, 100) g;
UPDATE keyed SET v = 'changed' WHERE id % 3 = 0;
PREPARE TRANSACTION 'crash';
"""


def test_kills_around_a_prepared_transaction_then_restart(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """two_phase: killed once its PREPARE is staged (not confirmed: sent again), then with
    its COMMIT PREPARED half applied (sent again), then applied with the staging left: the
    prepared transaction is applied exactly once, and no staging is left behind."""
    publisher.execute(KEYED_AND_BAG)
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(config, publisher, warehouse, two_phase=True, batch={"max_delay": "1s"})
    doomed = daemons(config, port, "apply.after_prepare_staged")  # creates the slot
    doomed.wait_ready()
    publisher.execute(PREPARE)
    assert doomed.wait_exit() == -9, doomed.logs()
    publisher.execute("COMMIT PREPARED 'crash'")
    publisher.execute(AFTER_CRASH)
    doomed = daemons(config, port, "apply.after_table_write")
    assert doomed.wait_exit() == -9, doomed.logs()
    publisher.execute(AFTER_SECOND_CRASH)
    doomed = daemons(config, port, "apply.before_prepared_forgotten")
    assert doomed.wait_exit() == -9, doomed.logs()
    assert staged_gids(warehouse) == ["crash"]  # applied, its staging not yet forgotten

    survivor = daemons(config, port)
    survivor.wait_ready()
    wait_confirmed(publisher)
    wait_until(lambda: staged_gids(warehouse) == [], timeout=60, what="no staging left")
    assert survivor.terminate() == 0, survivor.logs()

    assert_keyed_and_bag_equal(publisher, spark, warehouse)
