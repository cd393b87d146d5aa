"""Table sync under kill -9 (during the copy, during the catch-up) and a copy that keeps failing."""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import deltalake
import psycopg
import pytest

from apply.history.versions import CURRENT
from subscriber.replication.commands import StreamOptions
from subscriber.replication.lsn import Lsn
from subscriber.replication.progress import HeldProgress
from subscriber.replication.stream import ReplicationConnection
from tests.support.daemon import DaemonProcess, wait_confirmed, write_config
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication
from tests.support.writer import Writer

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE a (id int PRIMARY KEY, v text);
CREATE TABLE bag (x int, y text);
INSERT INTO a SELECT g, 'v' || g FROM generate_series(1, 5000) g;
INSERT INTO bag SELECT g % 5, 'b' FROM generate_series(1, 2000) g;
CREATE PUBLICATION pub FOR TABLE a, bag;
"""


def table_states(daemon: DaemonProcess) -> dict[str, str]:
    """Each table's state, as the daemon's /status says (none while it does not answer)."""
    try:
        body = daemon.get("/status")[1]
    except OSError:
        return {}
    return {
        t["table"]: t["state"] for s in body.get("subscriptions", []) for t in s.get("tables") or []
    }


def ready_states(daemon: DaemonProcess) -> bool:
    """Both tables READY (whichever daemon got them there)."""
    return table_states(daemon) == {"public.a": "ready", "public.bag": "ready"}


def test_kills_during_sync_then_restart(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """Under a steady writer, killed after a block of the copy, then (copying again) when the
    catch-up reached its LSN, then once SYNCDONE is stored: both tables end READY and equal
    to the publisher, and no sync slot is left behind."""
    publisher.execute(SCHEMA)
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(config, publisher, warehouse, copy_data=True)

    def step(conn: psycopg.Connection[Any], n: int) -> None:
        conn.execute("UPDATE a SET v = v || '+' WHERE id = %s", [n % 5000 + 1])
        conn.execute("INSERT INTO bag VALUES (%s, 'w')", [n])

    with Writer(publisher, step, pause=0.02) as writer:
        for failpoint in (
            "tablesync.after_copy_block",
            "tablesync.before_syncdone",
            "tablesync.after_syncdone",
        ):
            doomed = daemons(config, port, failpoint)
            assert doomed.wait_exit(timeout=300) == -9, doomed.logs()
        survivor = daemons(config, port)
        wait_until(lambda: ready_states(survivor), timeout=300, what="both tables READY")
        writer.stop()
        wait_confirmed(publisher)
        assert survivor.terminate() == 0, survivor.logs()
    with publisher.connect() as conn:
        assert_delta_equals_publisher(
            conn, "public.a", spark, str(warehouse / "public" / "a"), ("id",)
        )
        assert_delta_equals_publisher(conn, "public.bag", spark, str(warehouse / "public" / "bag"))
    assert publisher.slots() == ["sub1"]  # no sync slot left behind


@contextmanager
def slot_held(publisher: PgDatabase, slot: str) -> Iterator[None]:
    """``slot`` streamed to this test, confirming nothing: the daemon's leader cannot
    stream from it meanwhile (its tries fail with "replication slot ... is active")."""
    connection = ReplicationConnection(publisher.dsn)
    stream = connection.start_replication(
        slot, Lsn(0), StreamOptions(("pub",)), HeldProgress(), status_interval=1.0
    )
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            stream.read(timeout=0.2)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield
    finally:
        done.set()
        reader.join()
        stream.stop()


def test_a_finished_copy_catches_up_to_everything_the_slot_confirmed(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """Killed with the table copied (FINISHEDCOPY) but not handed over. Meanwhile its slot
    was confirmed past changes of the table, as a leader confirms the changes of a table not
    yet its own, while its checkpoint rows lag behind. On restart the leader cannot stream
    for a while (the slot is held): the catch-up it hands the table must still reach the
    slot's confirmed position, or the changes between are nobody's (the leader once handed
    over at its last checkpoint row's LSN; the rows below went missing)."""
    publisher.execute(
        "CREATE TABLE bag (x int, y text);"
        "INSERT INTO bag SELECT g % 5, 'b' FROM generate_series(1, 2000) g;"
        "CREATE PUBLICATION pub FOR TABLE bag;"
    )
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    # Each table on its own sync slot, as PostgreSQL (not the first start's initial load).
    port = write_config(config, publisher, warehouse, copy_data=True, copy={"initial_load": False})
    doomed = daemons(config, port, "tablesync.before_syncdone")
    assert doomed.wait_exit(timeout=300) == -9, doomed.logs()
    publisher.execute("INSERT INTO bag SELECT g, 'skipped' FROM generate_series(1, 500) g")
    written = str(publisher.wal_end())

    def advanced() -> bool:  # not past the WAL flushed yet: tried until it is
        return bool(
            publisher.fetchval(
                "SELECT end_lsn >= %s FROM pg_replication_slot_advance('sub1', %s)",
                [written, written],
            )
        )

    wait_until(advanced, timeout=60, what="slot sub1 confirmed past the skipped rows")
    with slot_held(publisher, "sub1"):
        survivor = daemons(config, port)
        # The sync worker runs on its own slot: its catch-up ends while the leader waits
        # (and the leader, at the slot's position, takes the table over at once).
        wait_until(
            lambda: table_states(survivor).get("public.bag") in ("syncdone", "ready"),
            timeout=300,
            what="bag SYNCDONE",
        )
    ready = {"public.bag": "ready"}
    wait_until(lambda: table_states(survivor) == ready, timeout=300, what="bag READY")
    publisher.execute("INSERT INTO bag VALUES (7, 'after')")
    wait_confirmed(publisher)
    assert survivor.terminate() == 0, survivor.logs()
    with publisher.connect() as conn:
        assert_delta_equals_publisher(conn, "public.bag", spark, str(warehouse / "public" / "bag"))
    resumed = next(  # at each try of the leader's while the slot was held
        e
        for e in survivor.events()
        if e.get("event") == "subscription resumes at its slot's confirmed position"
    )
    assert Lsn.parse(resumed["confirmed_lsn"]) > Lsn.parse(resumed["origin_lsn"])
    assert publisher.slots() == ["sub1"]


def test_failing_copy_is_retried_while_other_tables_replicate(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """A least-privilege role: REPLICATION and SELECT on the published tables - but one revoked."""
    publisher.execute(
        SCHEMA + "CREATE ROLE replicator LOGIN REPLICATION;"
        "GRANT SELECT ON a TO replicator;"  # not on bag: its copy fails
    )
    rep = Replication(
        publisher,
        spark,
        warehouse,
        copy_data=True,
        wal_retrieve_retry_interval=0.5,
        max_retry_interval=2,  # the backoff doubles up to this: a retry soon after the GRANT
    )
    least_privilege = publisher.dsn.replace("user=postgres", "user=replicator")
    rep.config = rep.config.model_copy(update={"connection": least_privilege})
    with rep:
        runner = rep.runner
        assert runner is not None

        def a_ready_bag_failing() -> bool:
            states = {s.qualified_name: s.state.label for s in runner.coordinator.statuses}
            errors = rep.metrics.registry.get_sample_value(
                "pgsub_sync_errors_total", {"subscription": "sub1"}
            )
            return states.get("public.a") == "ready" and (errors or 0) >= 2

        wait_until(a_ready_bag_failing, timeout=300, what="a READY while bag's copy fails")
        publisher.execute("INSERT INTO a VALUES (9999, 'during the failures')")
        rep.caught_up()
        rep.assert_equal("public.a", key=("id",))
        publisher.execute("GRANT SELECT ON bag TO replicator")  # the cause is removed

        def all_ready() -> bool:
            return all(s.state.label == "ready" for s in runner.coordinator.statuses)

        wait_until(all_ready, timeout=300, what="bag READY once it can be read")
        rep.caught_up()
        rep.assert_equal("public.bag")


RANGED = """
CREATE TABLE a (id int PRIMARY KEY, v text);
INSERT INTO a SELECT g, 'before' FROM generate_series(1, 40000) g;
CREATE PUBLICATION pub FOR TABLE a;
"""

# While the daemon is down: rows of the staged ranges deleted and their space reused by
# new versions of rows of the others, updates everywhere, keys changed, rows added.
WHILE_DOWN = [
    "DELETE FROM a WHERE id <= 3000",
    "VACUUM a",
    "UPDATE a SET v = 'moved' WHERE id > 36000",
    "UPDATE a SET v = 'changed' WHERE id % 97 = 0",
    "UPDATE a SET id = id + 100000 WHERE id BETWEEN 5000 AND 5050",
    "INSERT INTO a SELECT g, 'new' FROM generate_series(200001, 201000) g",
    "DELETE FROM a WHERE id % 101 = 0",
    "VACUUM FREEZE a",
    # A backlog the leader decodes for seconds after the restart, while the copy resumes
    # under a new snapshot: the leader is behind it when the catch-up starts.
    "CREATE TABLE backlog AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 600000) g",
]


@pytest.mark.parametrize(
    ("rewrite", "history"),
    [(False, "mirror"), (True, "mirror"), (False, "scd2")],
    ids=["resumed", "rewritten-starts-over", "resumed-versions"],
)
def test_a_copy_killed_between_ranges_resumes_with_the_ranges_staged(
    rewrite: bool,
    history: str,
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """A keyed table copied in 4 ranges, killed once 2 are staged; the publisher changes while
    the daemon is down (and, in one case, rewrites the table: VACUUM FULL), and leaves the
    leader a backlog to decode after the restart, so that the copy resumes under a snapshot
    the leader is behind of. A table kept with its history (here as versions) resumes the
    same way: its copy's rows are its first versions."""
    publisher.execute(RANGED)
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(
        config,
        publisher,
        warehouse,
        copy_data=True,
        copy={"ranges": 4, "readers": 1},
        spool_dir=str(tmp_path / "spool"),
        history={"mode": history},
    )
    doomed = daemons(config, port, "tablesync.after_range_staged=2")
    assert doomed.wait_exit(timeout=300) == -9, doomed.logs()
    for statement in WHILE_DOWN + (["VACUUM FULL a"] if rewrite else []):
        publisher.execute(statement)

    def step(conn: psycopg.Connection[Any], n: int) -> None:
        conn.execute("UPDATE a SET v = v || '+' WHERE id = %s", [n % 40000 + 1])
        conn.execute("INSERT INTO a VALUES (%s, 'w') ON CONFLICT DO NOTHING", [300000 + n])

    with Writer(publisher, step, pause=0.02) as writer:
        survivor = daemons(config, port)

        def ready() -> bool:
            events = survivor.events()
            return any(
                e.get("event") == "table state changed" and e.get("state") == "ready"
                for e in events
            )

        wait_until(ready, timeout=300, what="a READY")
        writer.stop()
        wait_confirmed(publisher)
        assert survivor.terminate() == 0, survivor.logs()
    events = survivor.events()
    if rewrite:
        assert [e for e in events if e.get("event", "").startswith("table copy starts over")]
        assert not [e for e in events if e.get("event") == "table copy resumes"]
    else:
        (resumed,) = [e for e in events if e.get("event") == "table copy resumes"]
        assert resumed["staged_ranges"] == 2 and resumed["ranges"] == 4
        assert resumed["staged_rows"] > 10000
        (finished,) = [e for e in events if e.get("event") == "table copy finished"]
        assert finished["resumed"] is True
        assert not [e for e in events if e.get("conflict")]  # replays are not conflicts
        # The leader was behind the new snapshot (the backlog): the catch-up replayed past
        # it, and the leader applies only after that. Else it applied again the rows the
        # resumed copy read - a versions table stopped on insert_exists.
        read_at = Lsn.parse(resumed["read_at"])
        (catch_up,) = [e for e in events if e.get("event", "").startswith("table catch-up")]
        assert Lsn.parse(catch_up["through"]) >= read_at
        syncdone = [e for e in events if e.get("state") == "syncdone"]
        assert syncdone and Lsn.parse(syncdone[-1]["lsn"]) >= read_at
    with publisher.connect() as conn:
        if history == "mirror":
            assert_delta_equals_publisher(
                conn, "public.a", spark, str(warehouse / "public" / "a"), ("id",)
            )
        else:
            published = dict(conn.execute("SELECT id, v FROM a").fetchall())
            kept = deltalake.DeltaTable(str(warehouse / "public" / "a")).to_pyarrow_table()
            current = [(r["id"], r["v"]) for r in kept.to_pylist() if r[CURRENT]]
            assert len(current) == len(published) and dict(current) == published
    assert publisher.slots() == ["sub1"]
    assert not list((tmp_path / "spool").rglob("*.parquet")), "staged ranges left behind"
    assert not list((tmp_path / "spool").rglob("manifest.json"))


LOADED = """
CREATE TABLE a (id int PRIMARY KEY, v text);
CREATE TABLE bag (x int, y text);
INSERT INTO a SELECT g, 'v' || g FROM generate_series(1, 200000) g;
INSERT INTO bag SELECT g % 5, 'b' FROM generate_series(1, 2000) g;
CREATE PUBLICATION pub FOR TABLE a, bag;
"""


def test_a_kill_in_the_first_start_load_keeps_the_tables_it_made_ready(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """Killed just after the first start's load stored its first READY tables (one loader:
    bag, the smaller, is copied first while a still copies): after the restart the READY
    tables are not copied again - the leader applies their changes from the slot's
    consistent point - and the others are synchronized on their own. Both end equal to the
    publisher under a steady writer, with no sync slot left."""
    publisher.execute(LOADED)
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(config, publisher, warehouse, copy_data=True, max_sync_workers=1)

    def step(conn: psycopg.Connection[Any], n: int) -> None:
        conn.execute("UPDATE a SET v = v || '+' WHERE id = %s", [n % 200000 + 1])
        conn.execute("INSERT INTO bag VALUES (%s, 'w')", [n])

    with Writer(publisher, step, pause=0.02) as writer:
        doomed = daemons(config, port, "tablesync.after_syncdone")
        assert doomed.wait_exit(timeout=300) == -9, doomed.logs()
        made_ready = {
            e["table"]
            for e in doomed.events()
            if e["event"] == "table state changed" and e["state"] == "ready"
        }
        assert made_ready, doomed.logs()
        survivor = daemons(config, port)
        wait_until(lambda: ready_states(survivor), timeout=300, what="both tables READY")
        writer.stop()
        wait_confirmed(publisher)
        assert survivor.terminate() == 0, survivor.logs()
    copied_again = {e["table"] for e in survivor.events() if e["event"] == "table copy started"}
    assert copied_again == {"public.a", "public.bag"} - made_ready
    with publisher.connect() as conn:
        assert_delta_equals_publisher(
            conn, "public.a", spark, str(warehouse / "public" / "a"), ("id",)
        )
        assert_delta_equals_publisher(conn, "public.bag", spark, str(warehouse / "public" / "bag"))
    assert publisher.slots() == ["sub1"]
