"""Which engine writes a batch: delta-rs only on a local warehouse with a local Spark and no
other writer to tell apart; tables sized once, and never a change log or a fixed choice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.errors import PySparkException

from apply.core.features import FeatureMode, TableFeatures
from apply.delta.placement import Placement
from apply.delta.spark.target import TargetTable


class _Conf:
    def __init__(self, master: str) -> None:
        self.master = master

    def get(self, key: str, default: str = "") -> str:
        return self.master if key == "spark.master" else default


class _Session:
    """What Placement asks a session: its master (a classic session's conf)."""

    def __init__(self, master: str) -> None:
        self.conf = _Conf(master)


def target(master: str = "local[2]", table: str = "public.t") -> TargetTable:
    session: Any = _Session(master)
    return TargetTable(session, table, f"/wh/{table}")


def placement(
    warehouse: str,
    *,
    other_writers: bool = False,
    features: TableFeatures | None = None,
    sees_warehouse: bool | None = False,
) -> Placement:
    return Placement(
        warehouse,
        features or TableFeatures(deletion_vectors=FeatureMode.NEVER),
        other_writers=other_writers,
        appended_only=lambda table: table == "public.log",
        sees_warehouse=sees_warehouse,
    )


def test_delta_rs_merges_where_the_daemon_reaches_the_warehouse(tmp_path: Path) -> None:
    """A local folder with Spark in this process; an object store whatever runs Spark (the
    daemon reaches it as the cluster does); never a store pgsub does not reach itself."""
    assert placement(str(tmp_path)).merges_locally(target())
    assert placement(f"file://{tmp_path}").merges_locally(target())
    assert not placement(str(tmp_path)).merges_locally(target("spark://master:7077"))
    assert placement("s3a://bucket/wh").merges_locally(target())
    assert placement("s3://bucket/wh").merges_locally(target("spark://master:7077"))
    assert not placement("hdfs://namenode/wh").merges_locally(target())


class _Listing:
    """A Spark Connect server's ``read.text(...).inputFiles()``: the folder as ``seen`` lists
    it (a path -> the paths listed)."""

    def __init__(self, seen: Callable[[Path], list[str]]) -> None:
        self.seen = seen
        self.asked: list[str] = []

    def text(self, uri: str) -> _Listing:
        self.asked.append(uri)
        self._uri = uri
        return self

    def inputFiles(self) -> list[str]:
        return self.seen(Path(self._uri.removeprefix("file://")))


class _Server:
    """A Spark Connect client (``is_remote``), its server's listing."""

    __module__ = "pyspark.sql.connect.session"

    def __init__(self, seen: Callable[[Path], list[str]]) -> None:
        self.read = _Listing(seen)


def unreadable(path: Path) -> list[str]:
    raise PySparkException(f"[PATH_NOT_FOUND] Path does not exist: {path}")


def test_pgsub_writes_a_warehouse_folder_that_spark_sees_as_it_does(tmp_path: Path) -> None:
    """Told (``spark.sees_warehouse``); a cluster whose driver is this process; or a Spark
    Connect server asked once to list a file of a fresh name: that file, none, or an error.
    The file is removed after."""
    server: Any = _Server(lambda path: [path.as_uri()] if path.exists() else [])
    assert placement(str(tmp_path), sees_warehouse=True).writes_itself(server)
    assert not placement(str(tmp_path), sees_warehouse=False).writes_itself(server)
    asked = placement(str(tmp_path), sees_warehouse=None)
    assert asked.writes_itself(server) and asked.writes_itself(server)
    assert len(server.read.asked) == 1  # once a process
    assert server.read.asked[0].startswith(f"file://{tmp_path}/_pgsub/")
    assert not list((tmp_path / "_pgsub").rglob("*.txt"))
    elsewhere: Any = _Server(lambda path: [])  # another machine's folder of that name
    assert not placement(str(tmp_path), sees_warehouse=None).writes_itself(elsewhere)
    failing: Any = _Server(unreadable)
    assert not placement(str(tmp_path), sees_warehouse=None).writes_itself(failing)
    cluster: Any = _Session("spark://master:7077")
    assert placement(str(tmp_path), sees_warehouse=None).writes_itself(cluster)
    # An object store is reached by both; a local Spark sees this disk.
    assert placement("s3a://bucket/wh", sees_warehouse=None).writes_itself(elsewhere)
    local: Any = _Session("local[2]")
    assert placement(str(tmp_path), sees_warehouse=None).writes_itself(local)


def test_origin_tracking_or_shared_tables_keep_every_batch_on_spark(tmp_path: Path) -> None:
    assert not placement(str(tmp_path), other_writers=True).merges_locally(target())


def test_the_spark_master_is_asked_once(tmp_path: Path) -> None:
    placed = placement(str(tmp_path))
    assert placed.spark_here(target("local[*]").session)
    assert placed.spark_here(target("spark://master:7077").session)  # the first look's answer


def test_a_table_is_sized_only_with_auto_and_never_a_change_log(tmp_path: Path) -> None:
    """``check_size`` returns before any read of the table: no session is needed here."""
    never = placement(str(tmp_path))
    assert not never.check_size(target())
    always = placement(str(tmp_path), features=TableFeatures(deletion_vectors=FeatureMode.ALWAYS))
    assert not always.check_size(target())
    auto = placement(str(tmp_path), features=TableFeatures())
    assert not auto.check_size(target(table="public.log"))
