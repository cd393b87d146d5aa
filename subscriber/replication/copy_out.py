"""``COPY ... TO STDOUT`` read off a connection's libpq handle, its socket waited on with
Python's lock released.

Every copy pgsub reads here: a table-sync worker's (on its replication
connection, ``stream.ReplicationConnection.copy_out``), the first start's
load and a range of a large table (on a psycopg connection,
``tablesync.copy``). PostgreSQL sends a copy as one message a row; psycopg's
own ``Copy`` hands each over as a ``memoryview`` of libpq's buffer through a
generator, and the blocks joined from those views cost about 3 us a row: a
400,000-row copy read in 1.2-1.5 s of this process's time, where this loop
(each row made ``bytes`` at once and libpq's buffer freed) takes 0.3 s
(docs/performance.md, "A copy's rows read off libpq").

The connection is left as psycopg would leave it: after the copy, idle in its
transaction; after a copy given up (its reader stopped early, or failed), the
query cancelled and its rows drained, so that the connection takes its next
command (a ``ROLLBACK TO SAVEPOINT``).
"""

from __future__ import annotations

import selectors
from collections.abc import Generator

import psycopg
from psycopg import pq


def copy_out(
    pgconn: pq.abc.PGconn, command: str, encoding: str = "utf-8"
) -> Generator[bytes, None, None]:
    """Run ``command`` (a ``COPY ... TO STDOUT``) and yield its rows as they arrive, one
    ``bytes`` each. Errors are psycopg's: the server's by its SQLSTATE
    (``psycopg.errors.error_from_result``), a lost connection an ``OperationalError``."""
    with selectors.DefaultSelector() as selector:
        selector.register(pgconn.socket, selectors.EVENT_READ)
        _started(pgconn, command, selector, encoding)
        finished = False
        try:
            get = pgconn.get_copy_data
            while True:
                nbytes, data = get(1)
                if nbytes > 0:
                    yield bytes(data)
                elif nbytes == 0:
                    selector.select()
                    pgconn.consume_input()
                else:
                    break
            finished = True
        finally:
            if not finished:
                _abandon(pgconn, selector)
        _ended(pgconn, selector, _result(pgconn, selector), pq.ExecStatus.COMMAND_OK, encoding)


def _started(
    pgconn: pq.abc.PGconn, command: str, selector: selectors.BaseSelector, encoding: str
) -> None:
    """``command`` sent, and its first result taken: the copy's start, or its error."""
    pgconn.send_query(command.encode(encoding))
    result = _result(pgconn, selector)
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        _ended(pgconn, selector, result, pq.ExecStatus.COPY_OUT, encoding)


def _ended(
    pgconn: pq.abc.PGconn,
    selector: selectors.BaseSelector,
    first: pq.abc.PGresult | None,
    expected: pq.ExecStatus,
    encoding: str,
) -> None:
    """The command's results after ``first`` taken to the last; raises unless ``first`` is
    ``expected``: the server's error as psycopg raises it, or the connection's."""
    while _result(pgconn, selector) is not None:
        pass
    if first is None:
        message = pgconn.error_message.decode(errors="replace").strip()
        raise psycopg.OperationalError(f"no result from the server: {message}")
    if first.status != expected:
        raise psycopg.errors.error_from_result(first, encoding=encoding)


def _result(pgconn: pq.abc.PGconn, selector: selectors.BaseSelector) -> pq.abc.PGresult | None:
    """libpq's next result, the socket waited on (not inside libpq) until it is whole."""
    while pgconn.is_busy():
        selector.select()
        pgconn.consume_input()
    return pgconn.get_result()


def _abandon(pgconn: pq.abc.PGconn, selector: selectors.BaseSelector) -> None:
    """A copy given up before its end: cancelled, what was still sent read and dropped,
    its results taken. On a connection that is lost already, nothing."""
    if pgconn.status != pq.ConnStatus.OK:
        return
    try:
        pgconn.get_cancel().cancel()
        while True:
            nbytes, _ = pgconn.get_copy_data(1)
            if nbytes < 0:
                break
            if nbytes == 0:
                selector.select()
                pgconn.consume_input()
        while _result(pgconn, selector) is not None:
            pass
    except psycopg.Error:
        pass  # the connection's next command says what is wrong with it
