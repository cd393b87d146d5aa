"""Target tables carry only the Delta reader features their data needs."""

import pytest

from apply.features import (
    COLUMN_MAPPING,
    DELETION_VECTORS,
    TYPE_WIDENING,
    FeatureMode,
    FeatureRefusedError,
    TableFeatures,
    creation_properties,
    gains,
    needs_column_mapping,
)

AUTO = TableFeatures()
NEVER = TableFeatures(FeatureMode.NEVER, FeatureMode.NEVER)
ALWAYS = TableFeatures(FeatureMode.ALWAYS, FeatureMode.ALWAYS, deletion_vectors=True)


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


def test_delta_rs_creates_a_table_only_when_it_enables_no_table_feature() -> None:
    from apply.delta.local_tables import delta_rs_creates
    from apply.delta.origins import ROW_TRACKING
    from apply.maintenance_policy import DEFAULT_POLICY, retention_properties

    plain = {**retention_properties(DEFAULT_POLICY), "pgsub.source": "public.t"}
    assert delta_rs_creates(plain)
    assert delta_rs_creates({})
    for wants_feature in (COLUMN_MAPPING, TYPE_WIDENING, DELETION_VECTORS, ROW_TRACKING):
        assert not delta_rs_creates({**plain, wants_feature: "true"})
    assert not delta_rs_creates(creation_properties(["a b"], AUTO, "public.t")[0])
    assert not delta_rs_creates(creation_properties(["id"], ALWAYS, "public.t")[0])
