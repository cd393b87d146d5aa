"""The pgsub Grafana dashboard, generated with grafana-foundation-sdk into ``pgsub.json``.

Every metric family the daemon exports (``subscriber/metrics.py``) has a
panel; ``$subscription`` and ``$relation`` narrow them. ``make test``
checks that ``pgsub.json`` is what this script makes, that every PromQL
expression parses (promtool) and that every metric it names is one a
running daemon serves (tests/deploy/).

    python deploy/grafana/dashboard.py > deploy/grafana/pgsub.json
"""

from __future__ import annotations

import sys

from grafana_foundation_sdk.builders import dashboard, heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SUB = 'subscription=~"$subscription"'
REL = f'{SUB}, relation=~"$relation"'
RATE = "$__rate_interval"


def query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def series(title: str, unit: str, *targets: tuple[str, str], width: int = 12) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).span(width)
    for expr, legend in targets:
        panel = panel.with_target(query(expr, legend))
    return panel.height(8)


def distribution(title: str, expr: str) -> heatmap.Panel:
    return (
        heatmap.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .with_target(query(expr, "{{le}}").format(PromQueryFormat.HEATMAP))
        .span(12)
        .height(8)
    )


def single(title: str, expr: str, unit: str = "none") -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .with_target(query(expr, "{{subscription}}"))
        .span(6)
        .height(4)
    )


def build() -> dashboard.Dashboard:
    return (
        dashboard.Dashboard("pgsub")
        .uid("pgsub")
        .description("PostgreSQL logical replication into Delta Lake: lag, throughput, tables")
        .tags(["pgsub", "postgresql", "delta-lake"])
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(dashboard.DatasourceVariable("datasource").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("subscription")
            .datasource(DATASOURCE)
            .query("label_values(pgsub_subscription_enabled, subscription)")
            .multi(True)
            .include_all(True)
        )
        .with_variable(
            dashboard.QueryVariable("relation")
            .datasource(DATASOURCE)
            .query(f"label_values(pgsub_table_state{{{SUB}}}, relation)")
            .multi(True)
            .include_all(True)
        )
        .with_row(dashboard.Row("Replication"))
        .with_panel(single("Enabled", f"pgsub_subscription_enabled{{{SUB}}}"))
        .with_panel(single("Streaming", f"pgsub_subscription_streaming{{{SUB}}}"))
        .with_panel(single("Failures in a row", f"pgsub_consecutive_failures{{{SUB}}}"))
        .with_panel(
            single(
                "Last message",
                f"time() - pgsub_last_msg_receipt_timestamp_seconds{{{SUB}}}",
                "s",
            )
        )
        .with_panel(
            series("Apply lag", "s", (f"pgsub_apply_lag_seconds{{{SUB}}}", "{{subscription}}"))
        )
        .with_panel(
            series(
                "Replication lag (WAL held by the slot)",
                "bytes",
                (f"pgsub_replication_lag_bytes{{{SUB}}}", "{{subscription}}"),
            )
        )
        .with_panel(
            series(
                "WAL the publisher keeps for the slot, and room before max_slot_wal_keep_size",
                "bytes",
                (f"pgsub_slot_retained_wal_bytes{{{SUB}}}", "kept {{subscription}}"),
                (f"pgsub_slot_safe_wal_size_bytes{{{SUB}}}", "room {{subscription}}"),
            )
        )
        .with_panel(
            series(
                "Slot wal_status (lost: invalidated, copy every table again)",
                "none",
                (f"pgsub_slot_wal_status{{{SUB}}} == 1", "{{subscription}} {{status}}"),
            )
        )
        .with_panel(
            series(
                "WAL received, flushed and sent (bytes/s)",
                "Bps",
                (f"rate(pgsub_received_lsn{{{SUB}}}[{RATE}])", "received {{subscription}}"),
                (f"rate(pgsub_flushed_lsn{{{SUB}}}[{RATE}])", "flushed {{subscription}}"),
                (f"rate(pgsub_latest_end_lsn{{{SUB}}}[{RATE}])", "publisher {{subscription}}"),
                width=24,
            )
        )
        .with_row(dashboard.Row("Throughput"))
        .with_panel(
            series(
                "Transactions applied",
                "ops",
                (
                    f"rate(pgsub_transactions_applied_total{{{SUB}}}[{RATE}])",
                    "{{subscription}}",
                ),
            )
        )
        .with_panel(
            series(
                "Changes applied by operation",
                "ops",
                (
                    f"sum by (op) (rate(pgsub_changes_applied_total{{{SUB}}}[{RATE}]))",
                    "{{op}}",
                ),
            )
        )
        .with_panel(
            distribution(
                "Batch duration",
                f"sum by (le) (rate(pgsub_batch_duration_seconds_bucket{{{SUB}}}[{RATE}]))",
            )
        )
        .with_panel(
            distribution(
                "MERGE duration",
                f"sum by (le) (rate(pgsub_merge_duration_seconds_bucket{{{REL}}}[{RATE}]))",
            )
        )
        .with_panel(
            series(
                "MERGE duration p99 by table",
                "s",
                (
                    "histogram_quantile(0.99, sum by (le, relation)"
                    f" (rate(pgsub_merge_duration_seconds_bucket{{{REL}}}[{RATE}])))",
                    "{{relation}}",
                ),
                width=24,
            )
        )
        .with_row(dashboard.Row("Tables"))
        .with_panel(
            series(
                "Tables by state",
                "none",
                (f"count by (state) (pgsub_table_state{{{REL}}} == 1)", "{{state}}"),
            )
        )
        .with_panel(
            series(
                "Initial copy progress",
                "percentunit",
                (
                    f"pgsub_tablesync_rows_copied_total{{{REL}}}"
                    f" / pgsub_tablesync_rows_estimated{{{REL}}}",
                    "{{relation}}",
                ),
                (
                    f"rate(pgsub_tablesync_rows_copied_total{{{REL}}}[{RATE}])",
                    "rows/s {{relation}}",
                ),
            )
        )
        .with_panel(
            series(
                "Workers",
                "none",
                (f"sum by (type) (pgsub_workers{{{SUB}}})", "{{type}}"),
            )
        )
        .with_panel(
            series(
                "Spooled large transactions",
                "bytes",
                (f"pgsub_spill_bytes{{{SUB}}}", "{{subscription}}"),
            )
        )
        .with_panel(
            series("Data files per table", "none", (f"pgsub_table_files{{{REL}}}", "{{relation}}"))
        )
        .with_panel(
            series(
                "Bytes written per table",
                "Bps",
                (
                    f"sum by (relation) (rate(pgsub_table_bytes_written_total{{{REL}}}[{RATE}]))",
                    "{{relation}}",
                ),
            )
        )
        .with_panel(
            series(
                "Write amplification (bytes written per byte of changed rows)",
                "none",
                (
                    f"sum by (relation) (rate(pgsub_table_bytes_written_total{{{REL}}}[{RATE}]))"
                    f" / sum by (relation) (rate(pgsub_table_change_bytes_total{{{REL}}}[{RATE}]))",
                    "{{relation}}",
                ),
            )
        )
        .with_panel(
            series(
                "Maintenance",
                "none",
                (
                    f"sum by (operation) (increase(pgsub_maintenance_total{{{REL}}}[{RATE}]))",
                    "{{operation}}",
                ),
                (
                    f"sum (increase(pgsub_maintenance_errors_total{{{REL}}}[{RATE}]))",
                    "errors",
                ),
            )
        )
        .with_panel(
            distribution(
                "Maintenance duration",
                f"sum by (le) (rate(pgsub_maintenance_duration_seconds_bucket{{{SUB}}}[{RATE}]))",
            )
        )
        .with_row(dashboard.Row("Conflicts and errors"))
        .with_panel(
            series(
                "Conflicts by kind",
                "none",
                (
                    f"sum by (type) (increase(pgsub_conflicts_total{{{REL}}}[{RATE}]))",
                    "{{type}}",
                ),
            )
        )
        .with_panel(
            series(
                "Errors",
                "none",
                (
                    f"sum (increase(pgsub_apply_errors_total{{{SUB}}}[{RATE}]))",
                    "apply",
                ),
                (
                    f"sum (increase(pgsub_sync_errors_total{{{SUB}}}[{RATE}]))",
                    "table sync",
                ),
            )
        )
    )


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
