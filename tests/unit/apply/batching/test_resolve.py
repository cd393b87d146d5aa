"""What each action does to a batch's net effect (apply.batching.resolve), on collapsed batches."""

from apply.batching.collapse import KeyedNet, collapse
from apply.batching.resolve import looks_up_first, resolve
from apply.core.batch import Batch
from conflicts.findings import Finding
from conflicts.kinds import DEFAULTS, ConflictKind, First, Resolution, judge
from subscriber.replication.lsn import ZERO
from tests.unit.apply.builders import batch, dele, ins, relation, tx, upd

T = relation("id", "v", "big")


def keyed(b: Batch) -> KeyedNet:
    net = collapse(b.tables(lambda name: ZERO)["public.t"])
    assert isinstance(net, KeyedNet)
    return net


def findings(
    net: KeyedNet, found: set[int], foreign: frozenset[int] = frozenset()
) -> list[Finding]:
    """Judge ``net`` against a table holding the keys ``found`` (``foreign``: another writer's)."""
    out = []
    for row in net.rows.values():
        key = int(row.key[0] or b"0")
        kind = judge(row.first, key in found, key in foreign)
        if kind is not None:
            out.append(Finding(kind.value, row.first_tx, row.key, row.image, None))
    return out


def with_actions(**actions: str) -> dict[ConflictKind, Resolution]:
    chosen = dict(DEFAULTS)
    chosen.update({ConflictKind(k): Resolution(v) for k, v in actions.items()})
    return chosen


def keys(net: KeyedNet) -> list[int]:
    return sorted(int(k[0] or b"0") for k in net.rows)


def test_the_defaults_need_no_lookup_before_the_merge() -> None:
    assert not looks_up_first(DEFAULTS)
    assert looks_up_first(with_actions(insert_exists="skip"))
    assert looks_up_first(with_actions(update_missing="apply_remote"))
    assert looks_up_first(with_actions(delete_missing="error"))
    assert not looks_up_first(with_actions(insert_exists="apply_remote"))


def test_error_stops_on_the_first_conflicting_transaction() -> None:
    net = keyed(batch(tx(ins(T, 2, "a", "x")), tx(ins(T, 1, "b", "x"), end=200)))
    found = findings(net, {1, 2})
    result = resolve(net, found, DEFAULTS)
    assert result.stop is not None and result.stop.tx_index == 0
    assert {f.resolution for f in result.findings} == {"error"}


def test_skip_leaves_out_a_lone_insert_but_applies_later_changes_to_the_local_row() -> None:
    net = keyed(batch(tx(ins(T, 1, "a", "x"), ins(T, 2, "b", "x"), upd(T, 2, "c", "x"))))
    result = resolve(net, findings(net, {1, 2}), with_actions(insert_exists="skip"))
    assert result.stop is None
    assert keys(result.net) == [2]  # key 1 keeps its local row; key 2's update applies to it
    assert [f.resolution for f in result.findings] == ["skip", "skip"]


def test_skipping_a_move_onto_a_taken_key_keeps_the_row_at_its_old_key() -> None:
    net = keyed(batch(tx(upd(T, 9, "moved", "x", old=(1, None, None)))))
    result = resolve(net, findings(net, {1, 9}), with_actions(update_exists="keep_local"))
    assert keys(result.net) == []
    assert [f.kind for f in result.findings] == ["update_exists"]


def test_a_move_whose_old_key_changed_again_cannot_be_cut_and_is_applied() -> None:
    net = keyed(batch(tx(upd(T, 9, "moved", "x", old=(1, None, None)), ins(T, 1, "again", "y"))))
    result = resolve(net, findings(net, {1, 9}), with_actions(update_exists="skip"))
    assert keys(result.net) == [1, 9]
    assert [f.resolution for f in result.findings] == ["apply_remote"]


def test_update_missing_apply_remote_inserts_a_whole_row_only() -> None:
    net = keyed(batch(tx(upd(T, 1, "whole", "x"), upd(T, 2, "toast", ...))))
    result = resolve(net, findings(net, set()), with_actions(update_missing="apply_remote"))
    rows = result.net.rows
    assert rows[(b"1",)].reinserted and not rows[(b"2",)].reinserted
    assert sorted(str(f.resolution) for f in result.findings) == ["apply_remote", "skip"]


def test_a_skipped_move_of_a_missing_row_does_not_create_the_new_key() -> None:
    net = keyed(batch(tx(upd(T, 9, "moved", "x", old=(1, None, None)))))
    skipped = resolve(net, findings(net, set()), DEFAULTS)
    assert keys(skipped.net) == [1]  # only the (missing) old key: nothing to insert
    applied = resolve(net, findings(net, set()), with_actions(update_missing="apply_remote"))
    assert keys(applied.net) == [1, 9]


def test_keep_local_leaves_every_change_of_another_writers_row_out() -> None:
    net = keyed(
        batch(tx(upd(T, 1, "r", "x"), dele(T, 1, None, None)), tx(dele(T, 2, None, None), end=200))
    )
    found = findings(net, {1, 2}, foreign=frozenset({1, 2}))
    assert sorted(f.kind for f in found) == ["delete_origin_differs", "update_origin_differs"]
    kept = resolve(
        net, found, with_actions(update_origin_differs="keep_local", delete_origin_differs="skip")
    )
    assert keys(kept.net) == []
    applied = resolve(net, found, DEFAULTS)
    assert keys(applied.net) == [1, 2] and applied.stop is None


def test_origin_is_judged_only_for_changes_of_an_existing_row() -> None:
    assert judge(First.INSERT, True, True) is ConflictKind.INSERT_EXISTS
    assert judge(First.KEY_UPDATE_OLD, True, True) is ConflictKind.UPDATE_ORIGIN_DIFFERS
    assert judge(First.DELETE, True, True) is ConflictKind.DELETE_ORIGIN_DIFFERS
    assert judge(First.UPDATE, True, False) is None


def test_the_resolved_net_keeps_what_its_writer_reads_beside_the_rows() -> None:
    """The key values' format (``binary: true``), the TRUNCATE and the transactions' commits:
    a resolved net lost the key format once, and binary keys were read as text."""
    net = keyed(batch(tx(ins(T, 1, "a", "x"), ins(T, 2, "b", "x"))))
    net.key_kinds, net.commits = b"b", ((100, 5),)
    resolved = resolve(net, findings(net, {1}), with_actions(insert_exists="skip")).net
    assert keys(resolved) == [2]
    assert (resolved.key_kinds, resolved.commits) == (b"b", ((100, 5),))
