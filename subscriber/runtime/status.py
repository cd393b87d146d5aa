"""``pgsub status``: in one view, what PostgreSQL spreads over ``pg_stat_subscription``,
``pg_subscription_rel`` and ``pg_stat_subscription_stats``.

Two sources, and the view says which:

- **daemon**: a running daemon's ``/status`` on the config's metrics port
  (live positions, lag, copy progress and rate, errors, conflicts since it
  started);
- **state store**: without a daemon, what is durable - each table's stored
  state, the subscription's settings, its last checkpoint and the conflict
  table (read by delta-rs on a local warehouse, else through Spark, which
  takes a few seconds to start) - and the publisher's
  slot (its confirmed position, whether something streams it, the lag).

``render`` makes the terminal table (colour only on a TTY); ``--json``
prints the view as it is.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import psycopg

from subscriber.replication import session
from subscriber.runtime.config import Config

DAEMON, STATE_STORE = "daemon", "state store"
# pg_subscription_rel.srsubstate letters, by the state labels /status uses.
LETTERS = {
    "init": "i",
    "datasync": "d",
    "finishedcopy": "f",
    "syncwait": "w",
    "catchup": "c",
    "syncdone": "s",
    "ready": "r",
}
_GREEN, _YELLOW, _RED, _RESET = "\033[32m", "\033[33m", "\033[31m", "\033[0m"

View = dict[str, Any]


def status_url(config: Config) -> str:
    host = config.metrics.host
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - where the daemon listens, not a bind
        host = "127.0.0.1"
    return f"http://{host}:{config.metrics.port}/status"


def from_daemon(config: Config, timeout: float = 2.0) -> View | None:
    """The running daemon's view, or None when none answers."""
    url = status_url(config)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - http only
            body: View = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return {"source": DAEMON, "url": url, **body}


def from_state_store(config: Config, names: list[str]) -> View:
    """What is durable about ``names``: the state store, and each publisher's slot."""
    from apply.delta.state_store import (
        CheckpointStore,
        ConflictStore,
        PreparedStore,
        SettingsStore,
        TableStateStore,
    )
    from subscriber.runtime.admin import spark_on_demand
    from subscriber.runtime.settings import ENABLED, SKIP_LSN, TWO_PHASE

    spark = spark_on_demand(config, "pgsub-status", writes=False)  # started only if needed
    warehouse = config.warehouse
    checkpoints, states = CheckpointStore(spark, warehouse), TableStateStore(spark, warehouse)
    settings, conflicts = SettingsStore(spark, warehouse), ConflictStore(spark, warehouse)
    prepared = PreparedStore(spark, warehouse)
    subscriptions = []
    for name in names:
        sub = config.subscription(name)
        stored = settings.load(name)
        enabled = stored.get(ENABLED, "true" if sub.enabled else "false") == "true"
        origin = checkpoints.origin_lsn(name)
        tables = [
            {"table": _qualified(s.schema, s.name), "state": _label(s.state), "lsn": _lsn(s.lsn)}
            for s in sorted(states.load(name).values(), key=lambda s: (s.schema, s.name))
        ]
        entry: dict[str, Any] = {
            "name": name,
            "slot": sub.slot,
            "enabled": enabled,
            "two_phase": stored.get(TWO_PHASE) or ("pending" if sub.two_phase else "off"),
            "prepared": [gid for gid, _ in prepared.staged(name)],
            "state": "disabled" if not enabled else "not running",
            "flushed_lsn": str(origin) if int(origin) else None,
            "skip_lsn": stored.get(SKIP_LSN),
            "conflicts": conflicts.counts(name),
            "tables": tables,
        }
        entry.update(_slot(sub.conninfo(), sub.slot))
        subscriptions.append(entry)
    return {"source": STATE_STORE, "subscriptions": subscriptions}


def _slot(conninfo: str, slot: str) -> dict[str, Any]:
    """The slot's confirmed position on the publisher, whether it streams, and the lag."""
    try:
        with session.connect(conninfo, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text, active,"
                " pg_current_wal_lsn() - confirmed_flush_lsn"
                " FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
                [slot],
            ).fetchone()
    except psycopg.Error as exc:
        return {"publisher_error": type(exc).__name__}  # libpq's text may quote the conninfo
    if row is None:
        return {"slot_exists": False}
    return {
        "slot_exists": True,
        "slot_active": bool(row[1]),
        "confirmed_flush_lsn": row[0],
        "replication_lag_bytes": None if row[2] is None else int(row[2]),
    }


def _qualified(schema: str, name: str) -> str:
    from subscriber.replication.names import qualified_name

    return qualified_name(schema, name)


def _label(letter: str) -> str:
    return next((label for label, known in LETTERS.items() if known == letter), letter)


def _lsn(lsn: object) -> str | None:
    return None if lsn is None else str(lsn)


def only(view: View, name: str | None) -> View:
    """``view`` with only the subscription ``name`` (all when None)."""
    if name is None:
        return view
    return {**view, "subscriptions": [s for s in view["subscriptions"] if s["name"] == name]}


# -- the terminal view --------------------------------------------------------


def render(view: View, *, color: bool = False, now: float | None = None) -> str:
    now = time.time() if now is None else now

    def paint(text: str, tone: str) -> str:
        return f"{tone}{text}{_RESET}" if color else text

    source = view["source"] + (f" ({view['url']})" if view.get("url") else "")
    lines = [f"source: {source}", ""]
    for sub in view["subscriptions"]:
        state = str(sub.get("state"))
        tone = {"streaming": _GREEN, "error": _RED}.get(state, _YELLOW)
        enabled = "enabled" if sub.get("enabled", True) else "disabled"
        two_phase = sub.get("two_phase", "off")
        head = f"{sub['name']}  {paint(state, tone)}  {enabled}  slot {sub.get('slot')}"
        lines.append(head + (f"  two_phase {two_phase}" if two_phase != "off" else ""))
        lines.append(
            "  received {}  flushed {}  latest end {}".format(
                sub.get("received_lsn") or "-",
                sub.get("flushed_lsn") or sub.get("confirmed_flush_lsn") or "-",
                sub.get("latest_end_lsn") or "-",
            )
        )
        lines.append("  " + _lag(sub, now))
        if sub.get("slot_retained_wal_bytes") is not None:
            lines.append("  " + _slot_wal(sub, paint))
        counts = ", ".join(f"{k} {v}" for k, v in sorted((sub.get("conflicts") or {}).items()))
        apply, sync = sub.get("error_count", "-"), sub.get("sync_error_count", "-")
        lines.append(f"  errors: apply {apply}, sync {sync}   conflicts: {counts or 'none'}")
        if sub.get("last_error"):
            first = str(sub["last_error"]).splitlines()[0]
            finish = sub.get("last_error_finish_lsn")
            lines.append(paint(f"  last error: {first}", _RED))
            if finish:
                skip = f"pgsub skip -c ... {sub['name']} --lsn {finish}"
                lines.append(f"  (the transaction finished at {finish}: `{skip}` skips it)")
        if sub.get("prepared"):
            gids = ", ".join(sub["prepared"])
            lines.append(f"  prepared, waiting for COMMIT/ROLLBACK PREPARED: {gids}")
        if sub.get("slot_exists") is False:
            lines.append(
                paint(f"  the slot {sub.get('slot')} does not exist on the publisher", _RED)
            )
        lines.append("")
        lines.extend(_tables(sub.get("tables") or [], paint, now))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _slot_wal(sub: dict[str, Any], paint: Any) -> str:
    """What the slot makes the publisher keep, and how close the limit is."""
    status = str(sub.get("slot_wal_status"))
    text = f"slot holds {_bytes(int(sub['slot_retained_wal_bytes']))} of WAL ({status}"
    safe = sub.get("slot_safe_wal_size")
    text += f", {_bytes(int(safe))} before max_slot_wal_keep_size)" if safe is not None else ")"
    return paint(text, _RED) if status in ("unreserved", "lost") else text


def _lag(sub: dict[str, Any], now: float) -> str:
    parts = []
    lag = sub.get("replication_lag_bytes")
    parts.append(f"lag {_bytes(lag)}" if lag is not None else "lag -")
    if sub.get("apply_lag_seconds") is not None:
        parts.append(f"{float(sub['apply_lag_seconds']):.1f} s behind")
    receipt = sub.get("last_msg_receipt")
    if receipt:
        parts.append(f"last message {max(0.0, now - float(receipt)):.0f} s ago")
    if sub.get("slot_active") is not None:
        parts.append("slot streamed" if sub["slot_active"] else "slot idle")
    return "   ".join(parts)


def _tables(tables: list[dict[str, Any]], paint: Any, now: float) -> list[str]:
    if not tables:
        return ["  (no tables)"]
    header = ("TABLE", "STATE", "LSN", "COPY", "VERSION", "FILES", "WRITTEN")
    rows = [
        (
            str(t["table"]),
            f"{t['state']} ({LETTERS.get(str(t['state']), '?')})",
            str(t.get("lsn") or "-"),
            _copy(t),
            "-" if t.get("delta_version") is None else str(t["delta_version"]),
            "-" if t.get("files") is None else str(t["files"]),
            _written(t),
        )
        for t in tables
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = ["  " + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    for row, table in zip(rows, tables, strict=True):
        tone = _GREEN if row[1].startswith("ready") else _YELLOW
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        cells[1] = paint(cells[1], tone)
        out.append("  " + "  ".join(cells))
        if table.get("last_error"):
            out.append(paint("    " + _sync_failure(table, now), _RED))
    return out


def _sync_failure(table: dict[str, Any], now: float) -> str:
    """A table-sync worker's failures in a row, its last error's first line, the next try."""
    first = str(table["last_error"]).splitlines()[0]
    count = int(table.get("sync_failures") or 1)
    text = f"sync failed {count} time{'s' if count != 1 else ''}: {first}"
    retry_at = table.get("retry_at")
    if table.get("sync_worker"):
        text += " (trying again now)"
    elif retry_at is not None:
        text += f" (next attempt in {max(0.0, float(retry_at) - now):.0f} s)"
    return text


def _copy(table: dict[str, Any]) -> str:
    copied, estimated = table.get("rows_copied"), table.get("rows_estimated")
    if not copied:
        return "-"
    if not estimated or table.get("state") not in ("datasync",):
        return f"{copied:,} rows"
    share = min(1.0, copied / estimated)
    bar = "#" * round(share * 10) + "." * (10 - round(share * 10))
    text = f"[{bar}] {share:.0%} {copied:,}/{estimated:,}"
    rate, left = table.get("copy_rows_per_second"), table.get("copy_seconds_left")
    if rate:
        text += f", {rate:,.0f} rows/s"
    if left is not None:
        text += f", {left:.0f} s left"
    return text


def _written(table: dict[str, Any]) -> str:
    """What the table's batches wrote since the daemon started, and how many times the bytes
    of the rows they changed that is (its write amplification)."""
    written, changed = table.get("bytes_written"), table.get("bytes_changed")
    if not written:
        return "-"
    text = _bytes(int(written))
    if changed:
        text += f" ({int(written) / int(changed):,.0f}x its changes)"
    return text


def _bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} GB"
