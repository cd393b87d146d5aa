"""How often maintenance vacuums a table, and how much history each table keeps."""

from apply.core.maintenance_policy import DAY, MaintenancePolicy, retention_properties


def test_a_table_is_vacuumed_at_least_once_per_retention() -> None:
    """A short retention (a table rewritten at every batch) is not left a day to pile up:
    a table is vacuumed four times per retention, so replaced files stay at most a
    retention and a quarter."""
    assert MaintenancePolicy().vacuum_every == DAY
    assert MaintenancePolicy(retention=3600).vacuum_every == 900
    assert MaintenancePolicy(vacuum_interval=600, retention=3600).vacuum_every == 600


def test_every_table_keeps_its_history_for_the_retention() -> None:
    properties = retention_properties(MaintenancePolicy(retention=3600))
    assert set(properties.values()) == {"interval 1 hours"}
    assert "delta.deletedFileRetentionDuration" in properties
