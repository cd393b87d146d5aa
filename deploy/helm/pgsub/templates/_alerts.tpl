{{/*
The alerts, as Prometheus rule groups (docs/operations.md: what each means and what to do).
`make test` renders them, checks them with promtool and runs their unit tests
(tests/deploy/alerts-test.yaml).
*/}}
{{- define "pgsub.alerts" -}}
{{- $rule := .Values.metrics.prometheusRule -}}
groups:
  - name: pgsub
    rules:
      - alert: PgsubDown
        expr: absent_over_time(pgsub_subscription_enabled[5m])
        for: 5m
        labels: {severity: critical}
        annotations:
          summary: pgsub exports no metrics
          description: No pgsub metrics for 5 minutes - the pod is down, crash-looping or not scraped.
      - alert: PgsubApplyLagHigh
        expr: pgsub_apply_lag_seconds > {{ $rule.applyLagSeconds }}
        for: 10m
        labels: {severity: warning}
        annotations:
          summary: 'Subscription {{ "{{" }} $labels.subscription {{ "}}" }} applies {{ "{{" }} $value | humanizeDuration {{ "}}" }} behind its publisher'
          description: Its Delta tables lag the publisher's commits by more than {{ $rule.applyLagSeconds }} s for 10 minutes.
      - alert: PgsubReplicationLagGrowing
        expr: pgsub_replication_lag_bytes > {{ $rule.replicationLagBytes | int64 }} and deriv(pgsub_replication_lag_bytes[15m]) > 0
        for: 15m
        labels: {severity: warning}
        annotations:
          summary: 'Subscription {{ "{{" }} $labels.subscription {{ "}}" }} holds {{ "{{" }} $value | humanize1024 {{ "}}" }}B of WAL, and growing'
          description: The publisher keeps WAL for the slot until pgsub confirms it; growing lag fills the publisher's disk.
      - alert: PgsubSlotNearInvalidation
        expr: pgsub_slot_safe_wal_size_bytes < {{ $rule.slotSafeWalBytes | int64 }}
        for: 5m
        labels: {severity: critical}
        annotations:
          summary: 'The slot of subscription {{ "{{" }} $labels.subscription {{ "}}" }} is {{ "{{" }} $value | humanize1024 {{ "}}" }}B of WAL from being invalidated'
          description: The publisher invalidates the slot once it holds max_slot_wal_keep_size; then every table must be copied again. Find why pgsub does not confirm (`pgsub status`), or raise the limit.
      - alert: PgsubSlotInvalidated
        expr: pgsub_slot_wal_status{status="lost"} == 1
        labels: {severity: critical}
        annotations:
          summary: 'The publisher invalidated the slot of subscription {{ "{{" }} $labels.subscription {{ "}}" }}'
          description: Its changes since the slot's position are gone; `pgsub drop` and a new start copy every table again (docs/operations.md).
      - alert: PgsubApplyFailing
        expr: pgsub_consecutive_failures >= 3
        for: 5m
        labels: {severity: critical}
        annotations:
          summary: 'Subscription {{ "{{" }} $labels.subscription {{ "}}" }} failed {{ "{{" }} $value {{ "}}" }} attempts in a row'
          description: The apply worker keeps failing without progress; `pgsub status` names the error and its transaction.
      - alert: PgsubApplyErrors
        expr: increase(pgsub_apply_errors_total[10m]) > 0
        labels: {severity: warning}
        annotations:
          summary: 'Subscription {{ "{{" }} $labels.subscription {{ "}}" }} had apply errors'
          description: The apply worker failed and retried in the last 10 minutes.
      - alert: PgsubSyncErrors
        expr: increase(pgsub_sync_errors_total[15m]) > 0
        labels: {severity: warning}
        annotations:
          summary: 'Subscription {{ "{{" }} $labels.subscription {{ "}}" }} had table-sync errors'
          description: A table's initial copy or catch-up failed and will be retried.
      - alert: PgsubConflicts
        expr: sum by (subscription, relation, type) (increase(pgsub_conflicts_total[10m])) > 0
        labels: {severity: info}
        annotations:
          summary: '{{ "{{" }} $labels.type {{ "}}" }} conflicts on {{ "{{" }} $labels.relation {{ "}}" }} ({{ "{{" }} $labels.subscription {{ "}}" }})'
          description: Remote changes met local rows that were not as the publisher had them; the conflict table under _pgsub/conflicts has the rows.
      - alert: PgsubSubscriptionDisabled
        expr: pgsub_subscription_enabled == 0
        for: 15m
        labels: {severity: warning}
        annotations:
          summary: 'Subscription {{ "{{" }} $labels.subscription {{ "}}" }} is disabled'
          description: Disabled for 15 minutes (pgsub disable, or disable_on_error after an error); its slot holds WAL on the publisher meanwhile.
      - alert: PgsubNotStreaming
        expr: pgsub_subscription_streaming == 0 and on (subscription) pgsub_subscription_enabled == 1
        for: 10m
        labels: {severity: critical}
        annotations:
          summary: 'Subscription {{ "{{" }} $labels.subscription {{ "}}" }} is enabled but not streaming'
          description: It has not streamed from its slot for 10 minutes (what /readyz reports).
      - alert: PgsubTableStuckInSync
        expr: pgsub_table_state{state=~"init|datasync|finishedcopy|syncwait|catchup|syncdone"} == 1
        for: {{ $rule.syncStuckHours }}h
        labels: {severity: warning}
        annotations:
          summary: 'Table {{ "{{" }} $labels.relation {{ "}}" }} has been in {{ "{{" }} $labels.state {{ "}}" }} for {{ $rule.syncStuckHours }}h'
          description: Its synchronization does not finish; see the table-sync worker's errors in the log.
      - alert: PgsubWriteAmplification
        expr: >-
          sum by (subscription, relation) (rate(pgsub_table_bytes_written_total[30m])) > {{ $rule.writtenBytesPerSecond | int64 }}
          and
          sum by (subscription, relation) (rate(pgsub_table_bytes_written_total[30m]))
          > {{ $rule.writeAmplification }} * sum by (subscription, relation) (rate(pgsub_table_change_bytes_total[30m]))
        for: 30m
        labels: {severity: warning}
        annotations:
          summary: 'Table {{ "{{" }} $labels.relation {{ "}}" }} writes {{ "{{" }} $value | humanize1024 {{ "}}" }}B/s, more than {{ $rule.writeAmplification }} times the rows its batches change'
          description: Its batches rewrite far more than they change (a table rewritten whole for a few rows, say); the warehouse grows by that much and keeps it for maintenance.retention. `pgsub status` shows each table's writes; docs/tables.md, "What a batch writes", says what to set.
      - alert: PgsubMaintenanceFailing
        expr: increase(pgsub_maintenance_errors_total[1h]) > 2
        labels: {severity: warning}
        annotations:
          summary: 'Maintenance of {{ "{{" }} $labels.relation {{ "}}" }} keeps failing'
          description: Compaction or vacuum of the table failed 3 times in an hour; small files and old versions pile up.
{{- end -}}
