import pytest

from subscriber.replication.commands import (
    SnapshotAction,
    Streaming,
    StreamOptions,
    create_slot_command,
    proto_version_for,
    start_replication_command,
)
from subscriber.replication.errors import UnsupportedFeatureError
from subscriber.replication.lsn import Lsn


@pytest.mark.parametrize(
    ("version", "proto"), [(130010, 1), (140011, 2), (150018, 3), (160004, 4), (180004, 4)]
)
def test_proto_version_follows_postgresql(version: int, proto: int) -> None:
    assert proto_version_for(version) == proto


def test_create_slot_new_and_old_syntax() -> None:
    assert create_slot_command(150000, "s1", snapshot=SnapshotAction.USE, two_phase=True) == (
        "CREATE_REPLICATION_SLOT s1 LOGICAL pgoutput (SNAPSHOT 'use', TWO_PHASE)"
    )
    assert create_slot_command(140000, "s1", temporary=True, snapshot=SnapshotAction.EXPORT) == (
        "CREATE_REPLICATION_SLOT s1 TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT"
    )
    assert create_slot_command(170000, "s1", failover=True).endswith(
        "(SNAPSHOT 'nothing', FAILOVER)"
    )
    with pytest.raises(UnsupportedFeatureError, match="17"):
        create_slot_command(160000, "s1", failover=True)
    with pytest.raises(UnsupportedFeatureError, match="15"):
        create_slot_command(140000, "s1", two_phase=True)


@pytest.mark.parametrize("name", ["Sub", "a-b", "x" * 64, "", "a;DROP"])
def test_bad_slot_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="slot name"):
        create_slot_command(150000, name)


def test_publication_names_are_quoted() -> None:
    options = StreamOptions(publications=("pub1", 'we"ird', "it's"))
    rendered = start_replication_command("s", Lsn(0x10), options.pgoutput_options(150000))
    assert rendered == (
        "START_REPLICATION SLOT s LOGICAL 0/10 (\"proto_version\" '3', "
        '"publication_names" \'"pub1","we""ird","it\'\'s"\')'
    )


def test_options_by_server_version() -> None:
    full = StreamOptions(
        publications=("p",),
        binary=True,
        messages=True,
        streaming=Streaming.PARALLEL,
        two_phase=True,
        origin="none",
    )
    assert dict(full.pgoutput_options(160000)) == {
        "proto_version": "4",
        "publication_names": '"p"',
        "binary": "true",
        "messages": "true",
        "streaming": "parallel",
        "two_phase": "on",
        "origin": "none",
    }
    with pytest.raises(UnsupportedFeatureError, match="streaming = parallel"):
        full.pgoutput_options(150000)
    with pytest.raises(UnsupportedFeatureError, match="two_phase"):
        StreamOptions(("p",), two_phase=True).pgoutput_options(140000)
    with pytest.raises(UnsupportedFeatureError, match="origin"):
        StreamOptions(("p",), origin="none").pgoutput_options(150000)
    with pytest.raises(UnsupportedFeatureError, match="protocol 2"):
        StreamOptions(("p",), streaming=Streaming.ON, proto_version=1).pgoutput_options(150000)
