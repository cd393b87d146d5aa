"""``pgsub run`` with the warehouse in an object store (versitygw, a real S3 gateway):
the copy (ranged, resumable), streaming with a large transaction spooled, every history
mode, a conflict, schema changes, maintenance, ``pgsub status / resync / drop`` - each table
read back from the bucket by Spark and delta-rs and compared with the publisher; and the
stores it cannot use, each refused at once with what to fix."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import deltalake
import pytest

from apply.delta.writer.local_tables import opened
from apply.history.changelog import OP
from apply.history.stamps import DELETED
from apply.history.versions import CURRENT
from tests.plugins.s3 import S3Server
from tests.support.daemon import DaemonProcess, pgsub, wait_confirmed, write_config
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import free_port, wait_until
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.e2e

TABLES = """
CREATE TABLE keyed (id int PRIMARY KEY, v text, n int);
CREATE TABLE bag (a int, b text); ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE TABLE log (id int PRIMARY KEY, v text);
CREATE TABLE soft (id int PRIMARY KEY, v text);
CREATE TABLE ver (id int PRIMARY KEY, v text);
CREATE TABLE c (id int PRIMARY KEY, v text);
INSERT INTO keyed SELECT g, 'v' || g, g FROM generate_series(1, 20000) g;
INSERT INTO bag SELECT g % 7, 'dup' FROM generate_series(1, 50) g;
INSERT INTO log SELECT g, 'l' || g FROM generate_series(1, 30) g;
INSERT INTO soft SELECT g, 's' || g FROM generate_series(1, 30) g;
INSERT INTO ver SELECT g, 'x' || g FROM generate_series(1, 30) g;
INSERT INTO c SELECT g, 'c' || g FROM generate_series(1, 10) g;
CREATE PUBLICATION pub FOR TABLE keyed, bag, log, soft, ver, c
"""

WORKLOAD = """
UPDATE keyed SET v = 'changed' WHERE id % 97 = 0;
DELETE FROM keyed WHERE id BETWEEN 100 AND 120;
INSERT INTO bag VALUES (3, 'more'), (3, 'more');
DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag WHERE a = 1 LIMIT 2);
UPDATE log SET v = 'again' WHERE id < 5;
DELETE FROM soft WHERE id < 4;
UPDATE ver SET v = 'second' WHERE id < 6;
BEGIN;
INSERT INTO keyed SELECT g, 'big', g FROM generate_series(30001, 45000) g;
UPDATE keyed SET n = -n WHERE id % 2 = 0 AND id < 5000;
COMMIT;
ALTER TABLE keyed ADD COLUMN extra int;
UPDATE keyed SET extra = 1 WHERE id < 10;
ALTER TABLE c ALTER COLUMN id TYPE bigint;
"""


def path(warehouse: str, table: str) -> str:
    return f"{warehouse}/public/{table}"


@pytest.fixture
def object_store_daemon(
    publisher: PgDatabase,
    tmp_path: Path,
    s3_server: S3Server,
    s3_warehouse: str,
    daemons: Callable[..., DaemonProcess],
) -> Iterator[tuple[Path, int]]:
    """A config for ``sub1`` with its warehouse in the bucket, and its metrics port."""
    publisher.execute(TABLES)
    publisher.set_config("logical_decoding_work_mem", "64kB")  # the big transaction streams
    config = tmp_path / "pgsub.yaml"
    port = write_config(
        config,
        publisher,
        s3_warehouse,
        storage=s3_server,
        copy_data=True,
        copy={"ranges": 4, "range_size": "128kB", "readers": 2, "resumable": True},
        streaming="on",
        batch={"max_delay": "1s"},
        history={
            "tables": {
                "public.log": "changelog",
                "public.soft": "soft_delete",
                "public.ver": "scd2",
            }
        },
        maintenance={"interval": "5s", "compact_files": 2},
    )
    yield config, port


def test_a_publication_replicated_into_an_object_store(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    s3_warehouse: str,
    object_store_daemon: tuple[Path, int],
    daemons: Callable[..., DaemonProcess],
) -> None:
    config, port = object_store_daemon
    daemon = daemons(config, port)
    daemon.wait_ready()
    wait_until(lambda: _all_ready(daemon), timeout=300, what="every table READY")
    # Another engine deletes a row of c in the bucket: the publisher's update of it is then
    # update_missing, skipped and reported as PostgreSQL's subscriber does.
    opened(path(s3_warehouse, "c")).delete("id = 5")
    publisher.execute(
        WORKLOAD + "UPDATE c SET v = 'gone' WHERE id = 5; UPDATE c SET v = 'kept' WHERE id = 6;"
    )
    wait_confirmed(publisher, timeout=300)
    metrics = daemon.get("/metrics")[1]
    assert 'type="update_missing"' in metrics
    wait_until(
        lambda: "pgsub_maintenance_total{" in daemon.get("/metrics")[1],
        timeout=120,
        what="a maintenance round in the bucket",
    )
    status = json.loads(_ok(pgsub("status", "-c", str(config), "--json")).stdout)
    tables = {t["table"]: t for t in status["subscriptions"][0]["tables"]}
    assert {t["state"] for t in tables.values()} == {"ready"}
    assert tables["public.keyed"]["bytes_written"] > 0
    assert daemon.terminate() == 0, daemon.logs()

    with publisher.connect() as conn:
        for table, key in (("keyed", ("id",)), ("bag", ())):
            assert_delta_equals_publisher(
                conn, f"public.{table}", spark, path(s3_warehouse, table), key
            )
        published_c = dict(conn.execute("SELECT id, v FROM c").fetchall())
        soft_rows = dict(conn.execute("SELECT id, v FROM soft").fetchall())
        ver_rows = dict(conn.execute("SELECT id, v FROM ver").fetchall())
    c_rows = {r["id"]: r["v"] for r in _rows(path(s3_warehouse, "c"))}
    assert c_rows == {k: v for k, v in published_c.items() if k != 5}  # the conflict's row
    soft = _rows(path(s3_warehouse, "soft"))
    assert {r["id"]: r["v"] for r in soft if not r[DELETED]} == soft_rows
    assert sorted(r["id"] for r in soft if r[DELETED]) == [1, 2, 3]
    versions = _rows(path(s3_warehouse, "ver"))
    assert {r["id"]: r["v"] for r in versions if r[CURRENT]} == ver_rows
    assert len(versions) == 30 + 5
    logged = Counter(r[OP] for r in _rows(path(s3_warehouse, "log")))
    assert logged["copy"] == 30 and logged["update"] == 4  # the copy's rows, each update once

    # Without a daemon: the state store read from the bucket, no Spark.
    stored = json.loads(_ok(pgsub("status", "-c", str(config), "--json")).stdout)
    assert stored["source"] == "state store"
    assert {t["state"] for t in stored["subscriptions"][0]["tables"]} == {"ready"}
    # Copied again: c holds the row the other engine deleted.
    _ok(pgsub("resync", "-c", str(config), "sub1", "public.c"))
    again = daemons(config, port)
    again.wait_ready()
    wait_until(lambda: _all_ready(again), timeout=300, what="public.c READY again")
    assert again.terminate() == 0, again.logs()
    with publisher.connect() as conn:
        assert_delta_equals_publisher(conn, "public.c", spark, path(s3_warehouse, "c"), ("id",))
    _ok(pgsub("drop", "-c", str(config), "sub1"))
    with publisher.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)
    assert _rows(path(s3_warehouse, "keyed"))  # the tables stay: drop keeps the data


def _rows(location: str) -> list[dict[str, Any]]:
    import pyarrow as pa

    table = opened(location)
    found = deltalake.QueryBuilder().register("t", table).execute("SELECT * FROM t")
    rows: list[dict[str, Any]] = pa.table(found.read_all()).to_pylist()
    return rows


def _ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"{done.args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _all_ready(daemon: DaemonProcess) -> bool:
    tables = daemon.get("/status")[1]["subscriptions"][0]["tables"]
    return bool(tables) and all(t["state"] == "ready" for t in tables)


@pytest.fixture
def store_without_conditional_puts(tmp_path: Path) -> Iterator[str]:
    """A real S3-compatible server that takes a second PUT of one name: moto 4.2's, which
    predates its support of If-None-Match."""
    port = free_port()
    log = (tmp_path / "moto.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"

        def bucket() -> bool:  # moto checks no signature: a plain PUT makes the bucket
            request = urllib.request.Request(f"{endpoint}/old", method="PUT")
            try:
                urllib.request.urlopen(request, timeout=5).close()
            except OSError:  # not listening yet
                return False
            return True

        wait_until(bucket, timeout=60, what="moto to listen")
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.parametrize("wrong", ["endpoint", "credentials", "bucket", "conditional put"])
def test_a_store_pgsub_cannot_use_stops_it_at_once_saying_what_to_fix(
    publisher: PgDatabase,
    tmp_path: Path,
    s3_server: S3Server,
    s3_warehouse: str,
    wrong: str,
    request: pytest.FixtureRequest,
) -> None:
    """Exit 2 within seconds, naming the warehouse, the subscription and what to fix: not a
    Java stack trace retried for ever, and never a credential."""
    publisher.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    config = tmp_path / "pgsub.yaml"
    warehouse = s3_warehouse
    if wrong == "bucket":
        warehouse = "s3a://no-such-bucket/wh"
    write_config(config, publisher, warehouse, storage=s3_server)
    text = config.read_text()
    if wrong == "endpoint":
        # A port held bound and never listened on: refused for the whole test. A port only
        # found free could be taken meanwhile by another worker's S3 server, which answers.
        unanswered = socket.socket()
        unanswered.bind(("127.0.0.1", 0))
        request.addfinalizer(unanswered.close)
        port = unanswered.getsockname()[1]
        text = text.replace(s3_server.endpoint, f"http://127.0.0.1:{port}")
    if wrong == "credentials":
        (tmp_path / "s3-secrets" / "AWS_SECRET_ACCESS_KEY").write_text("not-the-secret")
    if wrong == "conditional put":
        endpoint = request.getfixturevalue("store_without_conditional_puts")
        text = text.replace(s3_server.endpoint, endpoint).replace(s3_warehouse, "s3a://old/wh")
        for name, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
            (tmp_path / "s3-secrets" / name).write_text(value)
    config.write_text(text)
    started = time.monotonic()
    done = pgsub("run", "-c", str(config))
    assert done.returncode == 2, done.stdout + done.stderr
    assert time.monotonic() - started < 120
    message = done.stderr
    assert "sub1" in message and "Traceback" not in message and "at org.apache" not in message
    assert "not-the-secret" not in done.stdout + done.stderr
    said = {
        "endpoint": "does not answer at",
        "credentials": "refused the credentials",
        "bucket": "does not exist",
        "conditional put": "does not honour conditional PUTs",
    }[wrong]
    assert said in message, message
