"""The scale-out scenarios, run against each way of reaching Spark beyond ``local[*]``.

Two scenarios: copy, streaming apply, a conflict and ``pgsub status`` (on a
standalone cluster, ``tests/e2e/test_cluster.py``, and through a Spark
Connect server, ``tests/e2e/test_connect.py``); and a kill -9 of the daemon
once the copy has staged a range, a restart that resumes it killed between
a table's write and its checkpoint, then a last restart (through Spark
Connect; the staging by Spark tasks is the same code on a cluster). Each
ends with the Delta tables read back and compared with the publisher.
``spark`` says where the daemon's Spark is: ``{"master": "spark://..."}``
or ``{"remote": "sc://..."}``, with ``"sees_warehouse": False`` for the
copy read by Spark tasks and every batch merged by Spark; otherwise the
daemon finds that Spark sees its warehouse folder (one machine here), copies
and merges the small tables itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake

from tests.support.daemon import DaemonProcess, pgsub, wait_confirmed, write_config
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase

EMPTY_TABLES = """
CREATE TABLE keyed (id int PRIMARY KEY, v text);
CREATE TABLE bag (a int, b text); ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE keyed, bag;
"""
ROWS = """
INSERT INTO keyed SELECT g, 'copied' FROM generate_series(1, 20000) g;
INSERT INTO bag SELECT g % 10, 'copied' FROM generate_series(1, 3000) g;
"""
TABLES = EMPTY_TABLES + ROWS

CHANGES = """
INSERT INTO keyed SELECT g, 'streamed' FROM generate_series(20001, 21000) g;
BEGIN;
UPDATE keyed SET v = 'changed' WHERE id % 7 = 0;
DELETE FROM keyed WHERE id BETWEEN 100 AND 150;
INSERT INTO bag SELECT g % 10, 'copied' FROM generate_series(1, 500) g;
DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag WHERE a = 1 LIMIT 30);
COMMIT;
"""
RANGES = 3  # each table's initial copy is read by this many Spark tasks


def assert_equal(publisher: PgDatabase, spark: Any, warehouse: Path) -> None:
    with publisher.connect() as conn:
        keyed, bag = str(warehouse / "public" / "keyed"), str(warehouse / "public" / "bag")
        assert_delta_equals_publisher(conn, "public.keyed", spark, keyed, ("id",))
        assert_delta_equals_publisher(conn, "public.bag", spark, bag)


def tables_ready(daemon: DaemonProcess, count: int = 2) -> bool:
    """Whether ``/status`` shows ``count`` tables, each READY."""
    try:
        body = daemon.get("/status")[1]
    except OSError:
        return False
    tables = [t for s in body.get("subscriptions", []) for t in s.get("tables") or []]
    return len(tables) == count and all(t["state"] == "ready" for t in tables)


def copy_stream_conflicts_and_status(
    spark_config: dict[str, Any],
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
    while_running: Callable[[DaemonProcess], None] = lambda daemon: None,
) -> DaemonProcess:
    """The whole life of a subscription; returns the stopped daemon (its events to check).

    ``while_running`` looks at the daemon once its tables are READY."""
    publisher.execute(TABLES)
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(
        config, publisher, warehouse, copy_data=True, copy={"ranges": RANGES}, **spark_config
    )
    daemon = daemons(config, port)
    daemon.wait_ready(timeout=600)
    wait_until(lambda: tables_ready(daemon), timeout=600, what="both tables READY")
    while_running(daemon)
    publisher.execute(CHANGES)
    wait_confirmed(publisher, timeout=600)

    # Another writer removes a row; the publisher then deletes it: delete_missing, skipped.
    deltalake.DeltaTable(str(warehouse / "public" / "keyed")).delete("id = 5")
    publisher.execute("DELETE FROM keyed WHERE id = 5")
    wait_confirmed(publisher, timeout=600)
    metrics = daemon.get("/metrics")[1]
    assert (
        'pgsub_conflicts_total{relation="public.keyed",subscription="sub1",'
        'type="delete_missing"} 1.0' in metrics
    )

    live = pgsub("status", "-c", str(config), "--json")
    assert live.returncode == 0, live.stderr
    (sub,) = json.loads(live.stdout)["subscriptions"]
    assert sub["state"] == "streaming" and sub["error_count"] == 0
    assert sorted((t["table"], t["state"]) for t in sub["tables"]) == [
        ("public.bag", "ready"),
        ("public.keyed", "ready"),
    ]
    assert daemon.terminate() == 0, daemon.logs()
    assert_equal(publisher, spark, warehouse)
    # Each table's copy was read by Spark tasks, or by pgsub where Spark sees the warehouse
    # folder, each range under the sync slot's snapshot.
    by = "spark tasks" if spark_config.get("sees_warehouse") is False else "pgsub"
    started = [e for e in daemon.events() if e["event"] == "table copy started"]
    assert sorted((e["table"], e["ranges"], e["read_by"]) for e in started) == [
        ("public.bag", RANGES, by),
        ("public.keyed", RANGES, by),
    ]
    # The rows the copy's one commit wrote, from its own metrics (no accumulator on Connect).
    finished = [e for e in daemon.events() if e["event"] == "table copy finished"]
    assert sorted((e["table"], e["rows"]) for e in finished) == [
        ("public.bag", 3000),
        ("public.keyed", 20000),
    ]
    return daemon


# While the daemon is down: rows of the staged ranges deleted and their space reused by
# new versions of rows of the others, updates, a key changed, rows added, all frozen.
WHILE_DOWN = [
    "DELETE FROM keyed WHERE id <= 1500",
    "VACUUM keyed",
    "UPDATE keyed SET v = 'moved' WHERE id > 18000",
    "UPDATE keyed SET v = 'changed' WHERE id % 97 = 0",
    "UPDATE keyed SET id = id + 100000 WHERE id BETWEEN 2500 AND 2550",
    "INSERT INTO keyed SELECT g, 'new' FROM generate_series(200001, 201000) g",
    "DELETE FROM keyed WHERE id % 101 = 0",
    "VACUUM FREEZE keyed",
]


def kills_during_the_copy_and_a_batch_then_restart(
    spark_config: dict[str, Any],
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """kill -9 of the daemon once a range of the keyed table is staged by a Spark task; the
    publisher changes while it is down; the restart keeps the staged ranges, and is killed
    in turn between a batch's table write and its checkpoint (in the catch-up or the
    stream, whichever comes first); the last restart neither loses nor repeats rows."""
    publisher.execute(TABLES)
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(
        config,
        publisher,
        warehouse,
        copy_data=True,
        copy={"ranges": RANGES},
        spool_dir=str(tmp_path / "spool"),
        **spark_config,
    )
    doomed = daemons(config, port, "tablesync.after_range_staged=1")
    assert doomed.wait_exit(timeout=600) == -9, doomed.logs()
    for statement in WHILE_DOWN:
        publisher.execute(statement)
    resumed = daemons(config, port, "apply.before_checkpoint")
    wait_until(
        lambda: resumed.process.poll() is not None or tables_ready(resumed),
        timeout=600,
        what="the resumed copy's kill or both tables READY",
    )
    publisher.execute(CHANGES)  # if it still runs, its next batch is the kill
    assert resumed.wait_exit(timeout=600) == -9, resumed.logs()
    publisher.execute("INSERT INTO bag VALUES (42, 'after'); UPDATE keyed SET v = 'after'")

    survivor = daemons(config, port)
    survivor.wait_ready(timeout=600)
    wait_until(lambda: tables_ready(survivor), timeout=600, what="both tables READY")
    publisher.execute("UPDATE keyed SET v = 'last' WHERE id % 5 = 0")
    wait_confirmed(publisher, timeout=600)
    # Nothing staged is left: the warehouse's staging table is emptied beside the stream.
    # (Its log stays, with a checkpoint after ten commits. A Spark Connect server runs the
    # killed daemon's jobs on, whose files - attempt 1's partitions - a cleanup that ran
    # before they were written cannot remove.)
    staging = warehouse / "_pgsub" / "copy_staging" / "sub1" / "public" / "keyed"

    def staged_rows() -> list[Path]:
        return [
            f
            for f in staging.rglob("*.parquet")
            if "_delta_log" not in f.parts and not f.parent.name.endswith(".1")
        ]

    wait_until(lambda: not staged_rows(), timeout=600, what="the staged copy removed")
    assert deltalake.DeltaTable(str(staging)).to_pyarrow_table().num_rows == 0
    assert survivor.terminate() == 0, survivor.logs()
    events = resumed.events() + survivor.events()
    resumes = [e for e in events if e["event"] == "table copy resumes"]
    assert resumes, "the staged ranges were not kept"
    for resume in resumes:
        assert resume["table"] == "public.keyed" and 1 <= resume["staged_ranges"] <= RANGES
    assert not [e for e in events if e.get("conflict")]
    assert_equal(publisher, spark, warehouse)
    assert not list((tmp_path / "spool").rglob("*.parquet"))
