"""The config file: validation errors name the key; environment overrides every key."""

import os
from pathlib import Path

import pytest

from conflicts.kinds import Resolution
from subscriber.runtime.config import ConfigError
from subscriber.runtime.config_file import load

GOOD = """
warehouse: /data/wh
spark: {master: "local[2]", conf: {spark.sql.shuffle.partitions: 8, some.flag: true}}
subscriptions:
  - name: sub1
    connection: "host=db dbname=app user=replicator"
    publications: [pub1]
    copy_data: false
    streaming: off
    batch: {max_changes: 5000, max_delay: 250ms}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pgsub.yaml"
    path.write_text(text)
    return path


def test_defaults_follow_design_section_10(tmp_path: Path) -> None:
    config = load(write(tmp_path, GOOD), environ={})
    sub = config.subscriptions[0]
    assert sub.slot == "sub1" and sub.create_slot and sub.enabled
    assert sub.batch.max_delay == 0.25 and sub.batch.max_changes == 5000
    assert sub.conflicts.insert_exists is Resolution.ERROR
    assert sub.conflicts.update_missing is Resolution.SKIP
    assert config.metrics.port == 9187 and config.log.format == "json"
    assert config.spark.conf == {"spark.sql.shuffle.partitions": "8", "some.flag": "true"}


def test_unknown_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, GOOD.replace("max_delay", "max_dealy")), environ={})
    assert "subscriptions.0.batch.max_dealy: unknown key" in str(err.value)


def test_bad_value_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, GOOD.replace("250ms", "soon")), environ={})
    assert "subscriptions.0.batch.max_delay" in str(err.value) and "duration" in str(err.value)


def test_spark_connect_takes_an_sc_url(tmp_path: Path) -> None:
    text = GOOD.replace('master: "local[2]"', 'remote: "sc://spark:15002/;token=secret"')
    assert load(write(tmp_path, text), environ={}).spark.remote == "sc://spark:15002/;token=secret"
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, text.replace("sc://", "http://")), environ={})
    assert "spark.remote" in str(err.value) and "sc://" in str(err.value)


def test_environment_overrides_by_path_position_and_name(tmp_path: Path) -> None:
    env = {
        "PGSUB_WAREHOUSE": "s3a://bucket/wh",
        "PGSUB_METRICS_PORT": "9999",
        "PGSUB_SUBSCRIPTIONS_0_CONNECTION": "host=other",
        "PGSUB_SUBSCRIPTIONS_SUB1_MAX_SYNC_WORKERS": "4",
        "PGSUB_SUBSCRIPTIONS_SUB1_BATCH_MAX_CHANGES": "10",
    }
    config = load(write(tmp_path, GOOD), environ=env)
    sub = config.subscriptions[0]
    assert config.warehouse == "s3a://bucket/wh" and config.metrics.port == 9999
    assert sub.connection == "host=other" and sub.max_sync_workers == 4
    assert sub.batch.max_changes == 10


def test_environment_naming_no_key_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PGSUB_NOPE names no config key"):
        load(write(tmp_path, GOOD), environ={"PGSUB_NOPE": "1"})


def test_password_file_goes_into_the_connection_only(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    config = load(
        write(tmp_path, GOOD), environ={"PGSUB_SUBSCRIPTIONS_0_PASSWORD_FILE": str(secret)}
    )
    sub = config.subscriptions[0]
    assert "s3cret" in sub.conninfo() and "s3cret" not in sub.connection


def test_missing_password_file_is_named(tmp_path: Path) -> None:
    env = {"PGSUB_SUBSCRIPTIONS_0_PASSWORD_FILE": str(tmp_path / "absent")}
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, GOOD), environ=env)
    assert "subscriptions.0.password_file: cannot read" in str(err.value)


def test_malformed_connection_string_is_named_without_echoing_it(tmp_path: Path) -> None:
    text = GOOD.replace('"host=db dbname=app user=replicator"', '"host=db password=\'s3cret"')
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, text), environ={})
    assert "subscriptions.0.connection: not a valid libpq connection string" in str(err.value)
    assert "s3cret" not in str(err.value)


def test_duplicate_names_and_bad_slot_names_are_refused(tmp_path: Path) -> None:
    text = GOOD + "  - {name: sub1, connection: host=x, publications: [p], copy_data: false}\n"
    with pytest.raises(ConfigError, match="subscription names must be unique"):
        load(write(tmp_path, text), environ={})
    with pytest.raises(ConfigError, match="invalid replication slot name"):
        load(write(tmp_path, GOOD + "    slot_name: Bad-Name\n"), environ={})


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load(tmp_path / "nope.yaml", environ={})


def test_other_pgsub_variables_are_not_config(tmp_path: Path) -> None:
    env = {"PGSUB_FAILPOINTS": "x", "PGSUB_JARS_DIR": "/j", "PGSUB_TEST_PG_MAJORS": "15"}
    assert load(write(tmp_path, GOOD), environ=env).warehouse == "/data/wh"


@pytest.mark.parametrize(
    ("text", "size"),
    [("65536", 65536), ("64MB", 64 * 2**20), ("1 GiB", 2**30), ("512kB", 512 * 1024)],
)
def test_max_bytes_takes_postgresql_memory_units(tmp_path: Path, text: str, size: int) -> None:
    config = load(write(tmp_path, GOOD.replace("max_delay", f"max_bytes: {text}, max_delay")), {})
    bounds = config.subscriptions[0].batch.bounds()
    assert bounds.size == size and bounds.changes == 5000


def test_max_bytes_defaults_to_64mb_and_a_bad_size_is_named(tmp_path: Path) -> None:
    assert load(write(tmp_path, GOOD), {}).subscriptions[0].batch.max_bytes == 64 * 2**20
    with pytest.raises(ConfigError, match=r"subscriptions.0.batch.max_bytes: not a size"):
        load(write(tmp_path, GOOD.replace("max_delay", "max_bytes: lots, max_delay")), {})


def test_table_features_default_to_what_every_reader_opens(tmp_path: Path) -> None:
    from apply.core.features import PORTABLE, FeatureMode

    sub = load(write(tmp_path, GOOD), {}).subscriptions[0]
    assert sub.table_features.features() == PORTABLE
    text = GOOD.replace("copy_data: false", "table_features: {column_mapping: always}")
    sub = load(write(tmp_path, text), {}).subscriptions[0]
    assert sub.table_features.features().column_mapping is FeatureMode.ALWAYS


def test_tables_are_mirrors_unless_history_says_otherwise_per_table(tmp_path: Path) -> None:
    from apply.history.changelog import MIRRORS, HistoryMode

    sub = load(write(tmp_path, GOOD), {}).subscriptions[0]
    assert sub.history.history() == MIRRORS
    text = GOOD.replace("copy_data: false", "history: {tables: {public.orders: changelog}}")
    history = load(write(tmp_path, text), {}).subscriptions[0].history.history()
    assert history.of("public.orders") is HistoryMode.CHANGELOG
    assert history.of("public.items") is HistoryMode.MIRROR
    with pytest.raises(ConfigError, match="history"):
        load(write(tmp_path, GOOD.replace("copy_data: false", "history: {mode: scd9}")), {})


def test_copies_in_ranges_are_resumable_unless_told_not_to(tmp_path: Path) -> None:
    sub = load(write(tmp_path, GOOD), {}).subscriptions[0]
    assert sub.initial_copy.settings().resumable
    text = GOOD.replace("copy_data: false", "copy: {ranges: 4, resumable: false}")
    settings = load(write(tmp_path, text), {}).subscriptions[0].initial_copy.settings()
    assert settings.ranges == 4 and not settings.resumable


def test_default_spool_is_per_user_subscription_and_warehouse(tmp_path: Path) -> None:
    """Two daemons on one host, each with a subscription ``sub1`` into its own warehouse,
    do not share a spool (each empties its spool at start); a restart finds its own."""
    sub = load(write(tmp_path, GOOD), environ={}).subscriptions[0]
    one, other = sub.spool_path(str(tmp_path / "a")), sub.spool_path(str(tmp_path / "b"))
    assert one != other and one.parent == other.parent
    assert one.parent.name == f"pgsub-{os.getuid()}" and one.name.startswith("sub1-")
    assert sub.spool_path(str(tmp_path / "a")) == one
    assert sub.spool_path("s3://bucket/wh") != sub.spool_path("s3://bucket/other")
    explicit = sub.model_copy(update={"spool_dir": tmp_path / "spool"})
    assert explicit.spool_path(str(tmp_path / "a")) == tmp_path / "spool"
