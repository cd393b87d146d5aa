"""``pgsub status``'s terminal view: every figure in its place, colour only when asked."""

from subscriber.runtime.status import DAEMON, STATE_STORE, only, render

LIVE = {
    "source": DAEMON,
    "url": "http://127.0.0.1:9187/status",
    "subscriptions": [
        {
            "name": "sub1",
            "slot": "sub1",
            "enabled": True,
            "state": "error",
            "received_lsn": "0/2000",
            "flushed_lsn": "0/1F00",
            "latest_end_lsn": "0/2100",
            "replication_lag_bytes": 512,
            "apply_lag_seconds": 3.25,
            "last_msg_receipt": 1000.0,
            "last_error": 'conflict detected on relation "public.t"\nCONTEXT: ...',
            "last_error_finish_lsn": "0/1F80",
            "error_count": 2,
            "sync_error_count": 1,
            "conflicts": {"insert_exists": 2, "update_missing": 5},
            "slot_retained_wal_bytes": 3 * 1024 * 1024,
            "slot_wal_status": "extended",
            "slot_safe_wal_size": 1024**3,
            "tables": [
                {
                    "table": "public.t",
                    "state": "ready",
                    "lsn": "0/100",
                    "delta_version": 7,
                    "files": 3,
                    "bytes_written": 3 * 1024 * 1024,
                    "bytes_changed": 1024,
                },
                {
                    "table": "public.big",
                    "state": "datasync",
                    "lsn": None,
                    "rows_copied": 500,
                    "rows_estimated": 1000,
                    "copy_rows_per_second": 250.0,
                    "copy_seconds_left": 2.0,
                },
                {
                    "table": "public.odd",
                    "state": "init",
                    "sync_worker": False,
                    "sync_failures": 3,
                    "last_error": "column 'by': pgsub could not read a value\nCONTEXT: ...",
                    "retry_at": 1024.0,
                },
            ],
        },
        {"name": "sub2", "state": "streaming", "tables": []},
    ],
}


def test_the_live_view_names_every_figure() -> None:
    text = render(LIVE, now=1004.0)
    assert text.startswith("source: daemon (http://127.0.0.1:9187/status)")
    assert "sub1  error  enabled  slot sub1" in text
    assert "received 0/2000  flushed 0/1F00  latest end 0/2100" in text
    assert "lag 512 B   3.2 s behind   last message 4 s ago" in text
    assert "errors: apply 2, sync 1   conflicts: insert_exists 2, update_missing 5" in text
    assert 'last error: conflict detected on relation "public.t"' in text
    assert "`pgsub skip -c ... sub1 --lsn 0/1F80` skips it" in text
    assert "public.big  datasync (d)" in text and "[#####.....] 50% 500/1,000" in text
    assert "250 rows/s, 2 s left" in text
    assert "slot holds 3.0 MB of WAL (extended, 1.0 GB before max_slot_wal_keep_size)" in text
    failed = text.splitlines()[
        text.splitlines().index(next(line for line in text.splitlines() if "public.odd" in line))
        + 1
    ]
    assert failed.strip() == (
        "sync failed 3 times: column 'by': pgsub could not read a value (next attempt in 20 s)"
    )
    ready = next(line for line in text.splitlines() if "public.t " in line)
    assert "ready (r)" in ready and ready.split()[-7:-5] == ["7", "3"]
    # what its batches wrote, beside the rows they changed: write amplification per table
    assert ready.endswith("3.0 MB (3,072x its changes)")
    assert "\033[" not in text


def test_colour_only_when_asked_and_one_subscription_only() -> None:
    assert "\033[31merror\033[0m" in render(LIVE, color=True, now=1004.0)
    one = only(LIVE, "sub2")
    assert [s["name"] for s in one["subscriptions"]] == ["sub2"]
    assert "(no tables)" in render(one)


def test_the_stored_view_says_where_it_comes_from_and_what_the_slot_is() -> None:
    stored = {
        "source": STATE_STORE,
        "subscriptions": [
            {
                "name": "sub1",
                "slot": "sub1",
                "enabled": False,
                "state": "disabled",
                "flushed_lsn": None,
                "confirmed_flush_lsn": "0/1F00",
                "slot_exists": True,
                "slot_active": False,
                "replication_lag_bytes": 4096,
                "conflicts": {},
                "two_phase": "enabled",
                "prepared": ["g1", "g2"],
                "tables": [{"table": "public.t", "state": "ready", "lsn": "0/100"}],
            },
            {
                "name": "gone",
                "slot": "gone",
                "state": "not running",
                "slot_exists": False,
                "tables": [],
            },
        ],
    }
    text = render(stored)
    assert text.startswith("source: state store\n")
    assert "sub1  disabled  disabled  slot sub1  two_phase enabled" in text
    assert "prepared, waiting for COMMIT/ROLLBACK PREPARED: g1, g2" in text
    assert "gone  not running  enabled  slot gone\n" in text  # two_phase off: not shown
    assert "flushed 0/1F00" in text and "lag 4.0 kB" in text and "slot idle" in text
    assert "the slot gone does not exist on the publisher" in text
