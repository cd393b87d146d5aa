"""A real publisher's row changes decoded in runs equal them decoded one by one.

Each major installed (15, 18), text and binary values, whole and streamed
transactions: keys changed ('K'), REPLICA IDENTITY FULL ('O'), unchanged
TOAST values ('u'), NULLs and a rolled-back subtransaction.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from subscriber.replication.commands import Streaming, StreamOptions, proto_version_for
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import BINARY, UNCHANGED, Commit, Message, StreamCommit, Update
from subscriber.replication.pgoutput import PgOutputDecoder
from subscriber.replication.runs import RunDecoder, WholeTransaction
from subscriber.replication.tuples import RowChanges
from tests.support.pgdatabase import PgDatabase
from tests.support.streaming import as_messages, create_slot, read_stream

pytestmark = pytest.mark.integration

# One transaction each.
WORKLOAD = [
    "INSERT INTO c SELECT g, 'text ' || g, CASE WHEN g % 7 = 0 THEN repeat(md5(g::text), 400)"
    " END, g * 1.5, now() FROM generate_series(1, 300) g",
    "UPDATE c SET n = n + 1",
    "UPDATE c SET id = id + 1000, t = NULL WHERE id <= 60",
    "INSERT INTO f SELECT g % 10, 'y' || g FROM generate_series(1, 100) g",
    "UPDATE f SET y = y || '!'",
    "DELETE FROM f",
    "DELETE FROM c WHERE id > 250 AND id < 1000",
    "UPDATE c SET n = 0 WHERE id = 105",  # small transactions: handed on whole
    "INSERT INTO f VALUES (1, 'one'), (2, 'two')",
    "DELETE FROM c WHERE id = 107",
    "BEGIN;"
    " INSERT INTO c SELECT g, 'streamed', NULL, g, now() FROM generate_series(2001, 2400) g;"
    " SAVEPOINT s;"
    " INSERT INTO c SELECT g, 'rolled back', NULL, g, now() FROM generate_series(3001, 3300) g;"
    " ROLLBACK TO SAVEPOINT s;"
    " UPDATE c SET t = 'streamed too' WHERE id > 2200;"
    " COMMIT",
]


def _end(messages: Sequence[Message]) -> bool:
    return sum(isinstance(m, Commit | StreamCommit) for m in messages) >= len(WORKLOAD)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_runs_of_a_real_workload_decode_as_one_by_one(
    publisher_any: PgDatabase, binary: bool
) -> None:
    db = publisher_any
    db.set_config("logical_decoding_work_mem", "64kB")
    db.execute(
        "CREATE TABLE c (id int PRIMARY KEY, t text, big text, n numeric, ts timestamptz);"
        "ALTER TABLE c ALTER big SET STORAGE EXTERNAL;"
        "CREATE TABLE f (x int, y text); ALTER TABLE f REPLICA IDENTITY FULL;"
        "CREATE PUBLICATION p FOR TABLE c, f"
    )
    create_slot(db, "runs")
    for statement in WORKLOAD:
        db.execute(statement)
    options = StreamOptions(("p",), binary=binary, streaming=Streaming.ON)
    raw: list[tuple[bytes, Lsn]] = []
    one_by_one = read_stream(db, "runs", options, _end, raw=raw)

    proto = proto_version_for(db.cluster.major * 10_000)
    runs = RunDecoder(PgOutputDecoder(proto), max_messages=200, held=lambda: None)
    decoded = [d for payload, lsn in raw for d in runs.push(payload, lsn)]
    assert as_messages(decoded) == one_by_one
    assert any(isinstance(d, WholeTransaction) for d in decoded)  # the small ones
    # As the receiver takes them: the frames each read brought, at once (``push_all``).
    runs = RunDecoder(PgOutputDecoder(proto), max_messages=200, held=lambda: None)
    frames = [(lsn, payload) for payload, lsn in raw]
    lots = [frames[at : at + 7] for at in range(0, len(frames), 7)]
    assert as_messages([d for lot in lots for d in runs.push_all(lot)]) == one_by_one

    walked = [g for d in decoded if isinstance(d, RowChanges) for g in d.groups if g.walked]
    assert len(walked) >= 10
    assert any(d.xids is not None for d in decoded if isinstance(d, RowChanges))
    updates = [m for m in one_by_one if isinstance(m, Update)]
    assert any(UNCHANGED in m.new.kinds for m in updates)
    assert any(m.old is not None and m.old_is_key for m in updates)
    assert any(m.old is not None and not m.old_is_key for m in updates)
    assert (BINARY in b"".join(m.new.kinds for m in updates)) is binary
