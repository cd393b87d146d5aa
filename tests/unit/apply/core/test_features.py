"""Target tables carry only the Delta reader features their data needs."""

import pytest

from apply.core.features import (
    CHANGE_DATA_FEED,
    COLUMN_MAPPING,
    DELETION_VECTORS,
    PORTABLE,
    TYPE_WIDENING,
    FeatureMode,
    FeatureRefusedError,
    TableFeatures,
    creation_properties,
    feed_wanted,
    gains,
    needs_column_mapping,
    size_gain,
    write_gain,
)

AUTO = TableFeatures()
NEVER = TableFeatures(FeatureMode.NEVER, FeatureMode.NEVER)
ALWAYS = TableFeatures(FeatureMode.ALWAYS, FeatureMode.ALWAYS, FeatureMode.ALWAYS)


@pytest.mark.parametrize("name", ["a b", "a,b", "x;", "{", "}", "(", ")", "a=b", "a\tb", "a\nb"])
def test_names_delta_stores_only_with_column_mapping(name: str) -> None:
    assert needs_column_mapping(name)


@pytest.mark.parametrize("name", ["a", "Grüße", "a.b", "a-b", "$x", "order", "é"])
def test_names_delta_stores_as_they_are(name: str) -> None:
    assert not needs_column_mapping(name)


def test_a_plain_table_is_created_with_no_reader_feature() -> None:
    assert creation_properties(["id", "v"], AUTO, "public.t") == ({}, [])


def test_a_column_name_that_needs_mapping_turns_it_on_at_creation() -> None:
    properties, needed = creation_properties(["id", "a b"], AUTO, "public.t")
    assert properties == {COLUMN_MAPPING: "name"}
    assert [g.feature for g in needed] == ["columnMapping"]
    assert "'a b'" in needed[0].reason


def test_always_creates_every_feature_and_logs_none_as_needed() -> None:
    properties, needed = creation_properties(["id"], ALWAYS, "public.t")
    assert properties == {COLUMN_MAPPING: "name", TYPE_WIDENING: "true", DELETION_VECTORS: "true"}
    assert needed == []


def test_never_refuses_a_name_that_needs_mapping_naming_the_column() -> None:
    with pytest.raises(FeatureRefusedError, match=r"column 'a b' of public.t.*column_mapping"):
        creation_properties(["a b"], NEVER, "public.t")


def test_a_widening_gains_type_widening_once() -> None:
    found = gains({}, [], ["n"], AUTO, "public.t")
    assert [(g.feature, g.property, g.value) for g in found] == [
        ("typeWidening", TYPE_WIDENING, "true")
    ]
    assert gains({TYPE_WIDENING: "true"}, [], ["n"], AUTO, "public.t") == []


def test_a_widening_refused_by_never_names_the_column_and_resync() -> None:
    with pytest.raises(FeatureRefusedError, match=r"column 'n' of public.t.*pgsub resync"):
        gains({}, [], ["n"], NEVER, "public.t")


def test_an_added_column_needs_mapping_only_where_the_table_has_none() -> None:
    assert [g.feature for g in gains({}, ["x y"], [], AUTO, "t")] == ["columnMapping"]
    assert gains({COLUMN_MAPPING: "name"}, ["x y"], [], AUTO, "t") == []
    assert gains({COLUMN_MAPPING: "none"}, ["plain"], [], AUTO, "t") == []


MIB = 2**20


def test_a_table_gains_deletion_vectors_only_once_it_grows_past_the_size() -> None:
    small = TableFeatures(deletion_vectors_above=100 * MIB)
    assert size_gain({}, 100 * MIB, small) is None
    gain = size_gain({}, 100 * MIB + 1, small)
    assert gain is not None
    assert (gain.feature, gain.property, gain.value) == (
        "deletionVectors",
        DELETION_VECTORS,
        "true",
    )
    assert "100 MiB" in gain.reason
    assert size_gain({DELETION_VECTORS: "true"}, 10**12, small) is None


@pytest.mark.parametrize("mode", [FeatureMode.ALWAYS, FeatureMode.NEVER])
def test_only_auto_turns_deletion_vectors_on_by_size(mode: FeatureMode) -> None:
    assert size_gain({}, 10**12, TableFeatures(deletion_vectors=mode)) is None


def test_a_new_table_has_no_deletion_vectors_unless_always() -> None:
    assert DELETION_VECTORS not in creation_properties(["id"], AUTO, "public.t")[0]
    never = TableFeatures(deletion_vectors=FeatureMode.NEVER)
    assert DELETION_VECTORS not in creation_properties(["id"], never, "public.t")[0]


def test_the_earlier_true_and_false_of_deletion_vectors_mean_always_and_never() -> None:
    from subscriber.runtime.config import TableFeaturesConfig

    assert (
        TableFeaturesConfig(deletion_vectors=True).features().deletion_vectors is FeatureMode.ALWAYS
    )
    assert (
        TableFeaturesConfig(deletion_vectors=False).features().deletion_vectors is FeatureMode.NEVER
    )
    sized = TableFeaturesConfig(deletion_vectors_above="1GB").features()
    assert (sized.deletion_vectors, sized.deletion_vectors_above) == (FeatureMode.AUTO, 2**30)


def test_delta_rs_creates_a_table_only_when_it_enables_no_table_feature() -> None:
    from apply.core.maintenance_policy import DEFAULT_POLICY, retention_properties
    from apply.delta.spark.origins import ROW_TRACKING
    from apply.delta.writer.creation import delta_rs_creates

    plain = {**retention_properties(DEFAULT_POLICY), "pgsub.source": "public.t"}
    assert delta_rs_creates(plain)
    assert delta_rs_creates({})
    for wants_feature in (COLUMN_MAPPING, TYPE_WIDENING, DELETION_VECTORS, ROW_TRACKING):
        assert not delta_rs_creates({**plain, wants_feature: "true"})
    assert not delta_rs_creates(creation_properties(["a b"], AUTO, "public.t")[0])
    assert not delta_rs_creates(creation_properties(["id"], ALWAYS, "public.t")[0])


def test_the_change_data_feed_is_on_only_on_request_and_never_turned_off() -> None:
    asked = TableFeatures(change_data_feed=True)
    properties, needed = creation_properties(["id"], asked, "public.t")
    assert properties == {CHANGE_DATA_FEED: "true"}
    assert needed == []  # a writer feature: nothing a reader must know, no warning
    assert creation_properties(["id"], PORTABLE, "public.t")[0] == {}
    assert feed_wanted({}, asked)
    assert not feed_wanted({CHANGE_DATA_FEED: "true"}, asked)
    assert not feed_wanted({}, PORTABLE)
    assert not feed_wanted({CHANGE_DATA_FEED: "true"}, PORTABLE)  # left as the user set it


def test_a_batch_that_would_rewrite_far_more_than_it_writes_gains_deletion_vectors() -> None:
    """A 1M-row table's 41-MB file rewritten for ten updates: gained, whatever its size; a
    batch changing most of a small table: rewritten; ``never`` and a table that has them:
    nothing to gain."""
    gained = write_gain({}, rewrite=41_000_000, rows=10, row_bytes=41, features=AUTO)
    assert gained is not None and gained.feature == "deletionVectors"
    assert "rewrite_factor: 4" in gained.reason
    assert write_gain({}, rewrite=60_000, rows=1_500, row_bytes=30, features=AUTO) is None
    assert write_gain({}, rewrite=12_000, rows=1, row_bytes=30, features=AUTO) is None
    # A small table is rewritten whatever the batch: a 75-column table's 24-KB file for a
    # batch that only deletes (no rows written), or for one row.
    assert write_gain({}, rewrite=24_020, rows=0, row_bytes=24_020, features=AUTO) is None
    assert write_gain({}, rewrite=65_536, rows=1, row_bytes=30, features=AUTO) is None
    assert write_gain({}, rewrite=65_537, rows=1, row_bytes=30, features=AUTO) is not None
    never = TableFeatures(deletion_vectors=FeatureMode.NEVER)
    assert write_gain({}, rewrite=41_000_000, rows=10, row_bytes=41, features=never) is None
    on = {DELETION_VECTORS: "true"}
    assert write_gain(on, rewrite=41_000_000, rows=10, row_bytes=41, features=AUTO) is None
    lenient = TableFeatures(rewrite_factor=20_000)
    assert write_gain({}, rewrite=41_000_000, rows=10, row_bytes=41, features=lenient) is None
