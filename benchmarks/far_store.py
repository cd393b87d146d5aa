"""One table's batch on an object store a cloud's round trip away (no PostgreSQL).

versitygw, the S3 gateway the tests use, answers on this machine in under a
millisecond; S3 answers a small request in 20-200 ms. Here every byte between
pgsub and the gateway goes through a proxy that holds it for half the round
trip each way (as ``tc netem`` would, which this machine's kernel lacks), so
a batch waits for its requests as it would on a cloud store. One table of
``--rows`` rows (20,000: its first update turns deletion vectors on; 50: it
is rewritten whole each batch), then single-row update batches through
``BatchApplier``, each timed: the median is about the round trips a table's
batch waits for, in sequence, times the round trip.

    python -m benchmarks.far_store --round-trips 20,40 --rows 20000,50

Nothing here is a test: it prints one line a round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def delaying_proxy(target_port: int, round_trip: float) -> int:
    """A TCP proxy on a free loopback port to ``target_port`` holding each chunk for half
    of ``round_trip`` seconds each way, in order; its port. It runs on a daemon thread."""
    from tests.support.pgcluster import free_port

    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                loop.call_later(round_trip / 2, writer.write, data)
        except OSError:
            pass
        finally:
            loop.call_later(round_trip / 2 + 0.001, writer.close)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        started.set()
        async with server:
            await server.serve_forever()

    threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True).start()
    started.wait(10)
    return port


def one_table(spark: Any, warehouse: str, rows: int, batches: int) -> list[float]:
    """Each batch's seconds: ``batches`` single-row updates of a table of ``rows`` rows."""
    from apply.delta.tables import DeltaTables
    from apply.worker.applier import BatchApplier
    from tests.unit.apply.builders import batch, ins, relation, tx, upd

    table = relation("id", "v")
    applier = BatchApplier("bench", DeltaTables(spark, warehouse, "bench"), lambda oid: None)
    try:
        inserts = (ins(table, i, f"{i:064d}") for i in range(rows))
        applier.apply(batch(tx(*inserts, end=100)))
        seconds = []
        for n in range(1, batches + 1):
            started = time.perf_counter()
            applier.apply(batch(tx(upd(table, n * 7 % rows, f"n{n}"), end=100 + n * 10)))
            seconds.append(time.perf_counter() - started)
        return seconds
    finally:
        applier.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--round-trips", default="20,40", help="milliseconds, comma-separated")
    parser.add_argument("--rows", default="20000,50", help="the table's rows, comma-separated")
    parser.add_argument("--batches", type=int, default=25)
    args = parser.parse_args()

    from apply.delta.files.storage import register
    from apply.delta.spark.session import SparkSettings, build_session
    from tests.plugins.s3 import S3Server, start_s3_server, stop_s3_server

    scratch = Path(tempfile.mkdtemp(prefix="pgsub-far-"))
    server = start_s3_server(scratch / "root")
    spark = None
    try:
        for milliseconds in (float(ms) for ms in args.round_trips.split(",")):
            port = delaying_proxy(int(server.endpoint.rsplit(":", 1)[1]), milliseconds / 1000)
            far = S3Server(f"http://127.0.0.1:{port}", server.root, server.process)
            if spark is None:
                settings = SparkSettings(master="local[2]", app_name="pgsub-far-store")
                spark = build_session(settings)
            hadoop = spark._jsc.hadoopConfiguration()
            for key, value in far.storage().spark_conf().items():
                hadoop.set(key.removeprefix("spark.hadoop."), value)
            for rows in (int(r) for r in args.rows.split(",")):
                bucket = server.bucket(f"far-{int(milliseconds)}-{rows}")
                warehouse = f"s3a://{bucket}/wh"
                register(warehouse, far.storage())
                seconds = sorted(one_table(spark, warehouse, rows, args.batches)[2:])
                median = seconds[len(seconds) // 2]
                print(
                    f"round trip {milliseconds:.0f} ms, {rows:,} rows: a one-table batch takes "
                    f"{median * 1000:.0f} ms (median of {len(seconds)}), "
                    f"{median / (milliseconds / 1000):.1f} round trips"
                )
    finally:
        if spark is not None:
            spark.stop()
        stop_s3_server(server)


if __name__ == "__main__":
    main()
