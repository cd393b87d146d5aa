"""The chart on a real Kubernetes cluster: installed as a user would, the pod replicating,
killed, upgraded, stuck past apply_timeout and scraped by a real Prometheus.

The cluster is the project's own (setup/k8s/, tests/support/kubernetes.py): Kubernetes
v1.34 built from the Go module proxy, containerd, one node. The image is the one
tests/plugins/docker.py builds from deploy/Dockerfile, imported into the node's
containerd. The publisher runs on this machine, reached by the pod at 10.88.0.1 with a
least-privilege role whose password comes from a Secret; the warehouse is a bucket of
versitygw (a real S3 gateway) on this machine, its keys from another Secret; the spool is
a PersistentVolume. Every check reads the tables back from the bucket with delta-rs and
compares them with the publisher, row for row (a row twice is a difference).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
import yaml

from apply.delta.files.storage import register
from apply.delta.writer.local_tables import opened
from tests.plugins.docker import Docker
from tests.plugins.s3 import ACCESS_KEY, SECRET_KEY, S3Server, start_s3_server, stop_s3_server
from tests.support import kubernetes
from tests.support.kubernetes import HOST, Cluster, running_cluster
from tests.support.pgcluster import DEFAULT_MAJOR, PgCluster, free_port, wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "pgsub"
RELEASE = POD_NAME = "pgsub"
POD = f"{POD_NAME}-0"
PASSWORD = secrets.token_urlsafe(16)
WAREHOUSE = "s3a://lake/warehouse"
TABLES = {"t1": 20_000, "t2": 2_000}
# Seconds; the chart's liveness probe fails 3 times 20 s apart after it. It must allow for the
# batch that starts the JVM (spark.start: on_demand) and runs its first MERGE on the bucket:
# at 30 s, under CI's load, the conflict's batch passed 90 s and the kubelet restarted the pod.
APPLY_TIMEOUT = 150


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    why = kubernetes.missing()
    if why is not None:
        pytest.skip(why)
    with running_cluster() as running:
        yield running


@pytest.fixture(scope="module")
def host_publisher() -> Iterator[PgCluster]:
    """A publisher the pods reach on the bridge: a role with REPLICATION and SELECT only,
    its password checked (scram) from the pod network."""
    publisher = PgCluster(major=DEFAULT_MAJOR, settings={"listen_addresses": "'*'"}).start()
    try:
        with (publisher.datadir / "pg_hba.conf").open("a") as hba:
            hba.write("host postgres replicator 10.88.0.0/24 scram-sha-256\n")
            hba.write("host replication replicator 10.88.0.0/24 scram-sha-256\n")
        with publisher.connect() as conn:
            conn.autocommit = True
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD '{PASSWORD}'")
            for table, rows in TABLES.items():
                conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text, n int)")
                conn.execute(
                    f"INSERT INTO {table} SELECT g, 'copied ' || g, g"
                    f" FROM generate_series(1, {rows}) g"
                )
            conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO replicator")
            conn.execute("CREATE PUBLICATION pub FOR TABLE t1, t2")
        yield publisher
    finally:
        publisher.destroy()


@pytest.fixture(scope="module")
def host_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """versitygw on every address of the machine: 127.0.0.1 for the test, 10.88.0.1 for pods."""
    server = start_s3_server(tmp_path_factory.mktemp("k8s-s3") / "root", host="0.0.0.0")
    server.bucket("lake")
    register(WAREHOUSE, server.storage())
    try:
        yield server
    finally:
        server.process.send_signal(signal.SIGCONT)  # a test may have left it stopped
        stop_s3_server(server)


def values(s3: S3Server, publisher: PgCluster, spool: str) -> dict[str, Any]:
    """The chart's values as a user writes them for this machine."""
    port = s3.endpoint.rsplit(":", 1)[1]
    return {
        "image": {"repository": "pgsub", "tag": "test", "pullPolicy": "Never"},
        "config": {
            "warehouse": WAREHOUSE,
            "storage": {"endpoint": f"http://{HOST}:{port}", "region": "us-east-1",
                        "path_style": True},
            "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "1g"}},
            "log": {"format": "json", "level": "info"},
            "subscriptions": [{
                "name": "sub1",
                "connection": f"host={HOST} port={publisher.port} dbname=postgres user=replicator",
                "publications": ["pub"],
                "batch": {"max_delay": "1s"},
                "apply_timeout": f"{APPLY_TIMEOUT}s",
                "status_interval": "1s",
            }],
        },
        "passwords": {"existingSecret": "pgsub-passwords"},
        "storageCredentials": {"existingSecret": "pgsub-s3"},
        "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
        "warehouseVolume": {"enabled": False},
        "spoolVolume": {"persistent": True, "size": "5Gi", "storageClass": spool},
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}},
        "terminationGracePeriodSeconds": 30,
    }  # fmt: skip


@dataclass
class Deployment:
    cluster: Cluster
    publisher: PgCluster
    s3: S3Server
    docker: Docker

    def pod(self) -> dict[str, Any]:
        pod: dict[str, Any] = self.cluster.kubectl_json("get", "pod", POD)
        return pod

    def wait_ready(self, timeout: float = 420, *, since: str | None = None) -> dict[str, Any]:
        """The pod Ready by its own probes (a new pod: one whose uid is not ``since``)."""
        found: dict[str, Any] = {}

        def ready() -> bool:
            try:
                pod = self.pod()
            except AssertionError:
                return False  # not created yet
            if since is not None and pod["metadata"]["uid"] == since:
                return False
            found.update(pod)
            conditions = pod.get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        try:
            wait_until(ready, timeout=timeout, interval=2, what=f"{POD} Ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None
        return found

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """``wait_until``, with the pod's description and log when it times out."""
        try:
            wait_until(condition, timeout=timeout, interval=2, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None

    def describe(self) -> str:
        out = self.cluster.run(str(kubernetes.CACHE / "bin" / "kubectl"), "describe", "pod", POD)
        logs = self.cluster.run(str(kubernetes.CACHE / "bin" / "kubectl"), "logs", POD, "--tail=40")
        return f"{out.stdout[-4000:]}\n{logs.stdout[-6000:]}{logs.stderr[-500:]}"

    def exec(self, *args: str) -> str:
        return self.cluster.kubectl("exec", POD, "--", *args, timeout=180)

    def published(self, table: str) -> list[tuple[Any, ...]]:
        with self.publisher.connect() as conn:
            return conn.execute(f"SELECT id, v, n FROM {table} ORDER BY id").fetchall()

    def replicated(self, table: str) -> list[tuple[Any, ...]] | None:
        delta = opened(f"{WAREHOUSE}/public/{table}")
        if delta is None:
            return None
        # delta-rs's DataFusion reader: it applies deletion vectors (a table gains them when
        # its batches would otherwise rewrite it: docs/tables.md).
        found = deltalake.QueryBuilder().register("t", delta).execute("SELECT id, v, n FROM t")
        rows = pa.table(found.read_all()).to_pylist()
        return sorted((r["id"], r["v"], r["n"]) for r in rows)

    def wait_equal(self, timeout: float = 300) -> None:
        """Every table in the bucket as the publisher has it: no row missing, none twice."""
        diff: dict[str, str] = {}

        def equal() -> bool:
            diff.clear()
            for table in TABLES:
                replicated, published = self.replicated(table), self.published(table)
                if replicated != published:
                    held = len(replicated) if replicated is not None else None
                    diff[table] = f"{held} rows in the bucket, {len(published)} published"
            return not diff

        try:
            wait_until(equal, timeout=timeout, interval=2, what="the tables to match the publisher")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {diff}\n{self.describe()}") from None


class Load:
    """Transactions on the publisher while the block runs: new rows, updates, deletes."""

    def __init__(self, publisher: PgCluster) -> None:
        self.publisher = publisher
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.done = 0
        self.error: BaseException | None = None

    def _run(self) -> None:
        rng = random.Random(53)
        try:
            with self.publisher.connect() as conn:
                conn.autocommit = True
                row = conn.execute("SELECT max(id) + 1 FROM t1").fetchone()
                assert row is not None
                next_id = int(str(row[0]))
                while not self.stop.is_set():
                    with conn.transaction():
                        conn.execute("INSERT INTO t1 VALUES (%s, 'loaded', 0)", (next_id,))
                        conn.execute(
                            "UPDATE t1 SET n = n + 1, v = 'updated' WHERE id = %s",
                            (rng.randrange(1, next_id),),
                        )
                        conn.execute(
                            "UPDATE t2 SET n = n + 1 WHERE id = %s", (rng.randrange(1, 2000),)
                        )
                        if next_id % 10 == 0:
                            conn.execute(
                                "DELETE FROM t1 WHERE id = %s", (rng.randrange(1, next_id),)
                            )
                    next_id += 1
                    self.done += 1
                    time.sleep(0.02)
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert self.error is None, f"the load failed: {self.error!r}"

    def wait(self, transactions: int, timeout: float = 120) -> None:
        target = self.done + transactions
        wait_until(lambda: self.done >= target, timeout=timeout, what="the load")


def _secrets_and_storage(cluster: Cluster, spool: Path) -> None:
    """What a user sets up before the chart: the Secrets, a storage class and its volume."""
    spool.mkdir(parents=True)
    os.chown(spool, 10001, 10001)  # a local volume: fsGroup does not reach a hostPath
    cluster.apply(
        yaml.safe_dump_all([
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pgsub-passwords"},
             "stringData": {"sub1": PASSWORD}},
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pgsub-s3"},
             "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY,
                            "AWS_SECRET_ACCESS_KEY": SECRET_KEY}},
            {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
             "metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner",
             "volumeBindingMode": "WaitForFirstConsumer"},
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "spool"},
             "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"],
                      "storageClassName": "local", "hostPath": {"path": str(spool)}}},
        ])
    )  # fmt: skip
    crds = sorted((kubernetes.CACHE / "crds").glob("*.yaml"))
    assert crds, "no prometheus-operator CRDs: run `make tools` as root"
    for crd in crds:
        cluster.kubectl("apply", "--server-side", "-f", str(crd))
    cluster.kubectl(
        "wait", "--for", "condition=established", "--timeout=60s",
        "crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com",
    )  # fmt: skip


@pytest.fixture(scope="module")
def deployed(
    cluster: Cluster,
    host_publisher: PgCluster,
    host_s3: S3Server,
    docker: Docker,
    image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Deployment:
    """The image in the node, the chart installed with a user's values, the pod Ready."""
    cluster.import_image(docker.client, image)
    folder = tmp_path_factory.mktemp("k8s")
    _secrets_and_storage(cluster, folder / "spool")
    chosen = values(host_s3, host_publisher, "local")
    (folder / "values.yaml").write_text(yaml.safe_dump(chosen))
    cluster.helm("install", RELEASE, str(CHART), "-f", str(folder / "values.yaml"))
    deployment = Deployment(cluster, host_publisher, host_s3, docker)
    deployment.wait_ready()
    return deployment


def test_the_pod_becomes_ready_copies_and_streams(deployed: Deployment) -> None:
    deployed.wait_equal()
    with deployed.publisher.connect() as conn:
        conn.execute("INSERT INTO t1 SELECT g, 'streamed', 0 FROM generate_series(20001, 20500) g")
        conn.execute("UPDATE t2 SET v = 'updated' WHERE id <= 100")
        conn.execute("DELETE FROM t1 WHERE id <= 50")
        conn.commit()
    deployed.wait_equal()
    pod = deployed.pod()
    assert deployed.exec("id", "-u").strip() == "10001"  # the chart's security context
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
              if "persistentVolumeClaim" in v]  # fmt: skip
    assert claims == [f"spool-{POD}"]
    assert deployed.cluster.kubectl_json("get", "pv", "spool")["status"]["phase"] == "Bound"
    status = deployed.exec("pgsub", "status", "-c", "/etc/pgsub/pgsub.yaml")
    assert "sub1" in status and "public.t1" in status and "public.t2" in status, status
    lines = [line for line in status.splitlines() if "public.t" in line]
    assert all("ready" in line for line in lines), status
    # The password never reaches the ConfigMap, the environment or the log.
    config = deployed.cluster.kubectl_json("get", "configmap", RELEASE)
    assert PASSWORD not in json.dumps(config) and SECRET_KEY not in json.dumps(config)
    assert "password_file: /etc/pgsub/passwords/sub1" in config["data"]["pgsub.yaml"]
    logs = deployed.cluster.kubectl("logs", POD)
    assert PASSWORD not in logs and SECRET_KEY not in logs


def test_the_service_monitor_and_rules_are_valid_against_the_operators_crds(
    deployed: Deployment,
) -> None:
    """helm install created them through the API server, which checks each against its CRD's
    schema: a wrong field is refused there, as on a real cluster."""
    monitor = deployed.cluster.kubectl_json("get", "servicemonitor", RELEASE)
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    rules = deployed.cluster.kubectl_json("get", "prometheusrule", RELEASE)
    alerts = {r["alert"] for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"PgsubConflicts", "PgsubApplyLagHigh", "PgsubWriteAmplification"} <= alerts
    monitor["spec"]["endpoints"][0]["port"] = {"not": "a port name"}
    for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
        monitor["metadata"].pop(key, None)
    refused = deployed.cluster.run(
        str(kubernetes.CACHE / "bin" / "kubectl"), "apply", "--server-side", "--dry-run=server",
        "--force-conflicts", "-f", "-", stdin=json.dumps(monitor),
    )  # fmt: skip
    assert refused.returncode != 0 and "port" in refused.stderr, refused.stderr


def test_a_deleted_pod_comes_back_and_nothing_is_lost_or_doubled(deployed: Deployment) -> None:
    old = deployed.pod()["metadata"]["uid"]
    with Load(deployed.publisher) as load:
        load.wait(100)
        deployed.cluster.kubectl("delete", "pod", POD, "--wait=false")
        deployed.wait_ready(since=old)
        load.wait(200)
    deployed.wait_equal()


def test_a_helm_upgrade_to_a_new_tag_rolls_the_pod(deployed: Deployment) -> None:
    deployed.docker.ok("tag", "pgsub:test", "pgsub:test-2")
    deployed.cluster.import_image(deployed.docker.client, "pgsub:test-2")
    old = deployed.pod()["metadata"]["uid"]
    with Load(deployed.publisher) as load:
        load.wait(100)
        deployed.cluster.helm(
            "upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "image.tag=test-2"
        )
        pod = deployed.wait_ready(since=old)
        assert pod["spec"]["containers"][0]["image"] == "pgsub:test-2"
        load.wait(200)
    deployed.wait_equal()
    history = json.loads(deployed.cluster.helm("history", RELEASE, "-o", "json"))
    assert [h["status"] for h in history][-1] == "deployed" and len(history) == 2


def test_a_pod_past_apply_timeout_fails_its_liveness_probe(deployed: Deployment) -> None:
    """The warehouse stops answering (versitygw stopped) with a batch in flight: /healthz
    turns 503 after apply_timeout, the kubelet restarts the container, and once the store
    is back the tables catch up."""
    restarts = deployed.pod()["status"]["containerStatuses"][0]["restartCount"]
    gateway = deployed.s3.process.pid
    os.kill(gateway, signal.SIGSTOP)
    try:
        with deployed.publisher.connect() as conn:
            conn.execute("UPDATE t1 SET v = 'while the store was away' WHERE id <= 1000")
            conn.commit()

        def restarted() -> bool:
            status = deployed.pod()["status"]["containerStatuses"][0]
            return bool(status["restartCount"] > restarts)

        wait_until(
            restarted, timeout=APPLY_TIMEOUT + 300, interval=3, what="the kubelet to restart pgsub"
        )
        events = deployed.cluster.kubectl_json(
            "get", "events", "--field-selector", f"involvedObject.name={POD},reason=Unhealthy"
        )["items"]
        messages = [e["message"] for e in events]
        assert any("Liveness probe failed" in m and "503" in m for m in messages), messages
    finally:
        os.kill(gateway, signal.SIGCONT)
    deployed.wait_ready()
    deployed.wait_equal()


@contextlib.contextmanager
def prometheus(folder: Path, target: str, rules: dict[str, Any]) -> Iterator[str]:
    """Debian's Prometheus scraping ``target`` every second, evaluating ``rules``."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("no prometheus: `make tools` installs Debian's prometheus")
    (folder / "rules.yaml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(folder / "rules.yaml")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(folder / "rules.yaml")],
        "scrape_configs": [{"job_name": "pgsub", "static_configs": [{"targets": [target]}]}],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (folder / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _api(base: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base}{path}", timeout=5) as reply:
        return json.loads(reply.read())["data"]


def test_prometheus_scrapes_the_pod_and_the_conflict_alert_fires(
    deployed: Deployment, tmp_path: Path
) -> None:
    rules = deployed.cluster.kubectl_json("get", "prometheusrule", RELEASE)["spec"]
    address = deployed.pod()["status"]["podIP"]
    with prometheus(tmp_path, f"{address}:9187", rules) as base:

        def scraped() -> bool:
            with contextlib.suppress(OSError):
                targets = _api(base, "/api/v1/targets")["activeTargets"]
                return bool(targets) and targets[0]["health"] == "up"
            return False

        wait_until(scraped, timeout=60, interval=1, what="Prometheus to scrape the pod")
        enabled = _api(base, "/api/v1/query?query=pgsub_subscription_enabled")["result"]
        assert [(r["metric"]["subscription"], r["value"][1]) for r in enabled] == [("sub1", "1")]

        # Another engine deletes rows in the bucket; the publisher then updates them: each an
        # update_missing conflict. Two, a few scrapes apart: increase() needs the counter to rise.
        table = f"{WAREHOUSE}/public/t2"
        for count, key in enumerate((1500, 1501), start=1):
            delta = opened(table)
            assert delta is not None
            delta.delete(f"id = {key}")
            with deployed.publisher.connect() as conn:
                conn.execute("UPDATE t2 SET v = 'gone' WHERE id = %s", (key,))
                conn.commit()
            # A conflict takes Spark's path (a MERGE job on the bucket): a while in a small pod.
            deployed.wait(
                lambda: _sum(_api(base, QUERY_CONFLICTS)) >= count,  # noqa: B023 - waited here
                timeout=300, what=f"the conflict on id {key} scraped",
            )  # fmt: skip

        def firing() -> list[dict[str, str]]:
            alerts = _api(base, "/api/v1/alerts")["alerts"]
            return [
                a["labels"]
                for a in alerts
                if a["state"] == "firing" and a["labels"]["alertname"] == "PgsubConflicts"
            ]

        wait_until(firing, timeout=60, interval=1, what="PgsubConflicts to fire")
        (labels,) = firing()
        assert (labels["type"], labels["relation"]) == ("update_missing", "public.t2"), labels


QUERY_CONFLICTS = "/api/v1/query?query=sum(pgsub_conflicts_total)"

SCRATCH = "/var/lib/pgsub/pgsub-10001/scratch"  # the JVM's, on the spool volume (TMPDIR)


def test_a_killed_containers_spark_scratch_is_removed_when_it_restarts(
    deployed: Deployment,
) -> None:
    """An OOM kill as the node makes it (SIGKILL to the container's first process): its JVM cannot
    remove its scratch (Spark's jars and blocks), and the spool volume outlives the
    container. The restarted container removes it as it starts."""
    # A conflict's MERGE takes Spark's path: the JVM starts, if it had not yet.
    key = 1600
    delta = opened(f"{WAREHOUSE}/public/t2")
    assert delta is not None
    delta.delete(f"id = {key}")
    with deployed.publisher.connect() as conn:
        conn.execute("UPDATE t2 SET v = 'jvm' WHERE id = %s", (key,))
        conn.commit()

    def spark_files() -> list[str]:
        found = deployed.exec("find", SCRATCH, "-mindepth", "2", "-maxdepth", "2")
        return [line for line in found.splitlines() if "/spark-" in line]

    deployed.wait(lambda: bool(spark_files()), timeout=300, what="the JVM's files in scratch")
    (killed,) = {path.rsplit("/", 1)[0] for path in spark_files()}
    status = deployed.pod()["status"]["containerStatuses"][0]
    container = status["containerID"].removeprefix("containerd://")
    inside = _host_processes(container)
    (first,) = [pid for pid in inside if _parent(pid) not in inside]  # the container's pid 1
    os.kill(first, signal.SIGKILL)

    def restarted() -> bool:
        now = deployed.pod()["status"]["containerStatuses"][0]
        return bool(now["restartCount"] > status["restartCount"] and now.get("ready"))

    deployed.wait(restarted, timeout=420, what="the container restarted and Ready")
    left = deployed.exec("find", SCRATCH, "-mindepth", "1", "-maxdepth", "1", "-type", "d")
    assert killed not in left.split(), left
    logs = deployed.cluster.kubectl("logs", POD, timeout=60)
    assert "scratch of stopped processes removed" in logs, logs[-3000:]
    # The rows the conflicts (this test's, the alert's) left out, sent again: each table
    # as the publisher has it after the kill.
    with deployed.publisher.connect() as conn:
        keys = (1500, 1501, key)
        rows = conn.execute("SELECT id, v, n FROM t2 WHERE id = ANY(%s)", (list(keys),))
        kept = rows.fetchall()
        conn.execute("DELETE FROM t2 WHERE id = ANY(%s)", (list(keys),))
        for row in kept:
            conn.execute("INSERT INTO t2 VALUES (%s, %s, %s)", row)
        conn.commit()
    deployed.wait_equal()


def _host_processes(container: str) -> list[int]:
    """The node's ids of the processes of the container ``container`` (by their cgroup)."""
    found = []
    for cgroup in Path("/proc").glob("[0-9]*/cgroup"):
        with contextlib.suppress(OSError):
            if container in cgroup.read_text():
                found.append(int(cgroup.parent.name))
    return found


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


def _sum(result: dict[str, Any]) -> float:
    values = result["result"]
    return float(values[0]["value"][1]) if values else 0.0
