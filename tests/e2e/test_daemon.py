"""``pgsub run`` as operators run it: config errors, probes, metrics, SIGTERM."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from apply.delta.writer.local_tables import opened
from tests.support.browser import rendered
from tests.support.daemon import (
    DaemonProcess,
    group_commands,
    pgsub,
    wait_confirmed,
    write_config,
)
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import free_port, wait_until
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.e2e


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "subscriptions:\n  - {name: s, connection: x, publications: [p], copy_data: false,"
        " bacth: {}}\n"
    )
    result = pgsub("run", "-c", str(config))
    assert result.returncode == 2
    assert "subscriptions.0.bacth: unknown key" in result.stderr


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("password_file: /nonexistent/pw", "subscriptions.0.password_file: cannot read"),
        ('connection: "host=db password=\'hunter2"', "subscriptions.0.connection: not a valid"),
    ],
)
def test_bad_connection_settings_exit_2_without_a_traceback(
    setting: str, named: str, tmp_path: Path
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        f"subscriptions:\n  - name: s\n    connection: host=db\n    publications: [p]\n"
        f"    {setting}\n"
    )
    result = pgsub("run", "-c", str(config))
    assert result.returncode == 2, result.stderr
    assert named in result.stderr
    assert "Traceback" not in result.stderr and "hunter2" not in result.stderr


def test_a_scratch_folder_open_to_others_exits_2_naming_it(tmp_path: Path) -> None:
    """Another user's (or a world-writable) ``pgsub-<uid>`` under a shared TMPDIR must not
    receive the JVM's files: refused at start, before any connection."""
    shared = tmp_path / "tmp" / f"pgsub-{os.getuid()}"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    config = tmp_path / "pgsub.yaml"
    config.write_text(
        f"warehouse: {tmp_path / 'warehouse'}\n"
        "subscriptions:\n  - {name: s, connection: host=127.0.0.1 port=1, publications: [p],"
        f" spool_dir: {tmp_path / 'spool'}}}\n"
    )
    result = pgsub("run", "-c", str(config), env={**os.environ, "TMPDIR": str(shared.parent)})
    assert result.returncode == 2, result.stderr
    assert f"Spark's scratch folder {shared} belongs to uid" in result.stderr
    assert "mode 777" in result.stderr and "set TMPDIR" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_exits_2(tmp_path: Path) -> None:
    result = pgsub("run", "-c", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "cannot read the config file" in result.stderr


def test_daemon_replicates_serves_probes_and_stops_on_sigterm(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    password = "not-a-real-secret-but-must-not-leak"
    # Maintenance every second: its rounds run beside the batches.
    maintenance = {"interval": "1s", "vacuum_interval": "1s", "compact_files": 2}
    port = write_config(config, publisher, warehouse, maintenance=maintenance)
    config.write_text(
        config.read_text().replace("user=postgres", f"user=postgres password={password}")
    )

    daemon = daemons(config, port)
    daemon.wait_ready()
    publisher.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g")
    publisher.execute("UPDATE t SET v = 'w' WHERE id < 10; DELETE FROM t WHERE id > 90")
    wait_confirmed(publisher)

    def tended() -> set[tuple[str, bool]]:
        return {
            (e["subscription"], bool(e["compacted"]))
            for e in daemon.events()
            if e["event"] == "table maintained"
        }

    def history_bound() -> bool:  # the checkpoints' properties, set by a round
        table = opened(str(warehouse / "_pgsub" / "checkpoints"))
        return "delta.logRetentionDuration" in table.metadata().configuration

    wait_until(  # the table's VACUUM, a state table's compaction and properties (delta-rs)
        lambda: {("sub1", False), ("_pgsub", True)} <= tended() and history_bound(),
        timeout=60,
        what="maintenance of public.t and of the state tables",
    )
    # A small table's batches and the maintenance of its tables and of the state tables
    # (their history's properties, compaction, VACUUM) need no Spark (spark.start:
    # on_demand): no JVM was started.
    assert "java" not in group_commands(daemon.process.pid)
    properties = opened(str(warehouse / "_pgsub" / "checkpoints")).metadata().configuration
    assert properties["delta.logRetentionDuration"] == "interval 168 hours"
    assert not any(e["event"] == "spark session started" for e in daemon.events())

    assert daemon.get("/healthz")[0] == 200
    status, body = daemon.get("/status")
    assert status == 200 and body["subscriptions"][0]["state"] == "streaming"
    metrics = daemon.get("/metrics")[1]
    assert password not in metrics and password not in str(body)
    for name in (
        "pgsub_received_lsn",
        "pgsub_flushed_lsn",
        "pgsub_transactions_applied_total",
        "pgsub_changes_applied_total",
        "pgsub_batch_duration_seconds_bucket",
        "pgsub_merge_duration_seconds_bucket",
        "pgsub_apply_lag_seconds",
        "pgsub_subscription_enabled",
        "pgsub_table_bytes_written_total",
        "pgsub_table_change_bytes_total",
    ):
        assert f"\n{name}{{" in metrics, name

    def written() -> bool:  # sampled from the confirmed batches every half second
        (table,) = daemon.get("/status")[1]["subscriptions"][0]["tables"]
        return bool(table["bytes_written"] > 0 and table["bytes_changed"] > 0)

    wait_until(written, timeout=10, what="each table's bytes written in /status")
    assert 'pgsub_changes_applied_total{op="INSERT",subscription="sub1"} 100.0' in metrics
    # The dashboard and the alerts of deploy/ query only what the daemon serves, and the
    # dashboard shows every family it serves.
    from tests.deploy.test_chart import queried_metrics

    served, panels = served_metrics(metrics)
    queried = queried_metrics()
    assert queried <= served, queried - served
    missing = {family for family, samples in panels.items() if not samples & queried}
    assert not missing, f"metric families without a dashboard panel: {missing}"
    # The status page at /, as a browser renders it once its script has read /status.
    dom = rendered(f"http://127.0.0.1:{port}/", tmp_path / "browser")
    assert 'data-subscription="sub1"' in dom and 'class="state streaming"' in dom, dom[-2000:]
    assert 'data-table="public.t"' in dom and "ready (r)" in dom
    assert "x its changes)" in dom  # each table's writes beside the rows they changed
    assert password not in dom
    request = urllib.request.Request(f"http://127.0.0.1:{port}/status", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 405

    assert daemon.terminate() == 0
    logs = daemon.logs()
    assert password not in logs
    events = [e["event"] for e in daemon.events()]
    assert "batch applied" in events and "pgsub stopped" in events
    with publisher.connect() as conn:
        assert_delta_equals_publisher(
            conn, "public.t", spark, str(warehouse / "public" / "t"), ("id",)
        )


def test_the_next_start_removes_the_spark_scratch_of_a_killed_daemon(
    publisher: PgDatabase, tmp_path: Path, daemons: Callable[..., DaemonProcess]
) -> None:
    """A JVM killed with its daemon cannot remove its scratch (Spark's blocks, spills and
    native libraries, on the chart's spool volume across the container's restarts).
    The next start removes it, before it needs a JVM of its own, and a daemon stopped by
    SIGTERM leaves none."""
    publisher.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    config = tmp_path / "pgsub.yaml"
    port = write_config(config, publisher, tmp_path / "warehouse", spark_start="at_start")
    temp = tmp_path / "tmp"
    temp.mkdir()
    scratch = temp / f"pgsub-{os.getuid()}" / "scratch"

    def folders() -> list[Path]:
        return sorted(p for p in scratch.iterdir() if p.is_dir())

    first = daemons(config, port, temp=temp)
    first.wait_ready()  # its JVM started before it streamed (spark.start: at_start)
    (killed,) = folders()
    made = {p.name.split("-")[0] for p in killed.iterdir()}
    assert {"spark", "blockmgr"} <= made, made  # Spark's local dir is the process's folder
    assert not [p for p in temp.iterdir() if p.name.startswith(("spark-", "blockmgr-"))]
    first.kill()
    assert killed.is_dir()
    (killed / "blockmgr-spilled").write_bytes(bytes(3 * 2**20))  # what a busy JVM leaves

    # spark.start: on_demand, and nothing to need Spark for: no JVM
    port = write_config(config, publisher, tmp_path / "warehouse")
    second = daemons(config, port, temp=temp)
    second.wait_ready()
    (living,) = folders()
    assert living != killed and "java" not in group_commands(second.process.pid)
    (removed,) = [
        e for e in second.events() if e["event"] == "scratch of stopped processes removed"
    ]
    assert removed["folders"] == 1 and removed["megabytes"] >= 3, removed
    assert second.terminate() == 0
    assert folders() == []


def _demo(warehouse: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "subscriber.runtime.cli", "demo", "--warehouse", str(warehouse),
        *args,
    ]  # fmt: skip


def test_demo_replicates_its_publisher_and_checks_itself_each_run(tmp_path: Path) -> None:
    """The README's first command: ``make demo`` runs ``pgsub demo``; run again in the same
    checkout, it starts clean (a new publisher each run) and replicates again; it leaves
    nothing under its temp dir (its publisher, its spool, its JVM's scratch)."""
    # Not under pytest's own temp dir, which the publisher's unprivileged OS user (the demo
    # runs PostgreSQL as one when started as root) cannot enter.
    temp = Path(tempfile.mkdtemp(prefix="pgsub-demo-test-"))
    temp.chmod(0o755)
    try:
        for run in (1, 2):
            result = subprocess.run(
                _demo(tmp_path / "wh", "--seconds", "20", "--port", "0"),
                check=False,
                capture_output=True,
                text=True,
                timeout=600,
                env={**os.environ, "TMPDIR": str(temp)},
            )
            output = result.stdout[-3000:] + result.stderr[-3000:]
            assert result.returncode == 0, f"run {run}: {output}"
            assert "accounts: 1000 rows on the publisher, 1000 in Delta" in result.stdout, output
            assert "Delta tables match the publisher." in result.stdout
            left = sorted(str(p.relative_to(temp)) for p in temp.rglob("*"))
            own = f"pgsub-{os.getuid()}"
            assert left == [own, f"{own}/scratch", f"{own}/scratch/.lock"], left
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_demo_whose_jvm_dies_with_it_ends_at_once_with_its_comparison(tmp_path: Path) -> None:
    """A signal to the whole process group (``timeout``, systemd's control-group kill) takes
    the Spark JVM too: the demo says so, compares with delta-rs, removes its publisher."""
    port = free_port()
    process = subprocess.Popen(
        _demo(tmp_path / "wh", "--port", str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:

        def streaming() -> bool:
            assert process.poll() is None, "the demo ended early"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(streaming, timeout=300, interval=0.5, what="the demo to stream")
        # the group's signal as it lands when the JVM goes first (the other order races the
        # demo's catch-up, which may finish with delta-rs before the JVM has exited)
        (jvm,) = _children(process.pid, "java")
        os.kill(jvm, signal.SIGTERM)
        wait_until(lambda: _exited(jvm), 60, what="the JVM to exit")
        os.killpg(process.pid, signal.SIGTERM)
        output, _ = process.communicate(timeout=120)  # not the catch-up's 300 s
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 1, output[-3000:]
    assert "the Spark JVM is gone" in output
    assert "Traceback" not in output, output[-3000:]
    assert "accounts: 1000 rows on the publisher" in output  # compared all the same
    assert not _listening(_publisher_port(output))  # its publisher is gone


def _children(pid: int, name: str) -> list[int]:
    """The processes called ``name`` whose parent is ``pid``."""
    found = subprocess.run(["pgrep", "-P", str(pid), name], check=False, capture_output=True)
    return [int(child) for child in found.stdout.split()]


def _exited(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie its parent has not reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _publisher_port(output: str) -> int:
    """The port of the demo's throwaway publisher, from its log line."""
    (line,) = [line for line in output.splitlines() if "demo publisher ready" in line]
    found = re.search(r"port\W+(\d+)", line)
    assert found, line
    return int(found.group(1))


def _listening(port: int) -> bool:
    """Whether a server still answers on the loopback ``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def served_metrics(exposition: str) -> tuple[set[str], dict[str, set[str]]]:
    """Every sample name the exposition's pgsub families can have, and per family its names."""
    panels: dict[str, set[str]] = {}
    for name, kind in re.findall(r"^# TYPE (pgsub_\w+) (\w+)", exposition, re.MULTILINE):
        base = name.removesuffix("_total")
        if kind == "counter":
            panels[base] = {f"{base}_total"}
        elif kind == "histogram":
            panels[base] = {f"{base}_{part}" for part in ("bucket", "sum", "count")}
        else:
            panels[base] = {name}
    return set().union(*panels.values()), panels
