"""Net effect per key and per multiset row (docs/architecture.md, "Batches")."""

from apply.batching.collapse import KeyedNet, MultisetNet, collapse
from apply.core.batch import Batch
from conflicts.kinds import First
from subscriber.replication.lsn import ZERO
from subscriber.replication.messages import ReplicaIdentity
from tests.unit.apply.builders import batch, dele, ins, relation, row, trunc, tx, upd

T = relation("id", "v", "big")


def net_of(b: Batch, table: str = "public.t") -> KeyedNet | MultisetNet:
    return collapse(b.tables(lambda name: ZERO)[table])


def keyed(b: Batch) -> KeyedNet:
    net = net_of(b)
    assert isinstance(net, KeyedNet)
    return net


def test_a_chain_keeps_its_first_change_and_last_image() -> None:
    net = keyed(batch(tx(ins(T, 1, "a", "x")), tx(upd(T, 1, "b", "x"), end=200)))
    (r,) = net.rows.values()
    assert r.first is First.INSERT and r.present and r.image == row(1, "b", "x")


def test_insert_then_delete_keeps_the_insert_for_conflict_judgement() -> None:
    net = keyed(batch(tx(ins(T, 1, "a", "x"), dele(T, 1, None, None))))
    (r,) = net.rows.values()
    assert r.first is First.INSERT and not r.present


def test_delete_then_insert_is_a_reinsert() -> None:
    net = keyed(batch(tx(dele(T, 1, None, None), ins(T, 1, "new", "y"))))
    (r,) = net.rows.values()
    assert r.first is First.DELETE and r.present and r.reinserted
    assert r.image == row(1, "new", "y")


def test_unchanged_toast_comes_from_an_earlier_image_of_the_chain() -> None:
    net = keyed(batch(tx(ins(T, 1, "a", "huge"), upd(T, 1, "b", ...))))
    (r,) = net.rows.values()
    assert r.image == row(1, "b", "huge") and not r.keeps_target_values


def test_unchanged_toast_without_an_earlier_image_keeps_the_target_value() -> None:
    net = keyed(batch(tx(upd(T, 1, "b", ...)), tx(upd(T, 1, "c", ...), end=200)))
    (r,) = net.rows.values()
    assert r.first is First.UPDATE and r.keeps_target_values and r.toast_key is None
    assert r.image == row(1, "c", ...)


def test_a_key_change_is_a_delete_and_an_insert() -> None:
    net = keyed(batch(tx(upd(T, 2, "b", "x", old=(1, None, None)))))
    old, new = net.rows[(b"1",)], net.rows[(b"2",)]
    assert old.first is First.KEY_UPDATE_OLD and not old.present
    assert new.first is First.KEY_UPDATE_NEW and new.present


def test_a_key_change_carries_toast_values_from_the_old_chain() -> None:
    net = keyed(batch(tx(ins(T, 1, "a", "huge"), upd(T, 2, "b", ..., old=(1, None, None)))))
    assert net.rows[(b"2",)].image == row(2, "b", "huge")
    assert net.rows[(b"1",)].first is First.INSERT and not net.rows[(b"1",)].present


def test_a_key_change_with_unsent_toast_points_at_the_old_target_row() -> None:
    net = keyed(batch(tx(upd(T, 2, "b", ..., old=(1, None, None)))))
    assert net.rows[(b"2",)].toast_key == (b"1",)
    # ...and through a second move it still points at the row that has the value.
    net = keyed(
        batch(
            tx(upd(T, 2, "b", ..., old=(1, None, None)), upd(T, 3, "c", ..., old=(2, None, None)))
        )
    )
    assert net.rows[(b"3",)].toast_key == (b"1",)


def test_truncate_drops_earlier_changes() -> None:
    net = keyed(batch(tx(ins(T, 1, "a", "x")), tx(trunc(T), ins(T, 2, "b", "y"), end=200)))
    assert net.truncated and list(net.rows) == [(b"2",)]


def test_transactions_at_or_below_the_applied_lsn_are_dropped() -> None:
    b = batch(tx(ins(T, 1, "a", "x"), end=100), tx(ins(T, 2, "b", "y"), end=200))
    work = b.tables(lambda name: b.transactions[0].end_lsn)["public.t"]
    assert [c.tx for c in work.changes] == [1]


FULL = relation("a", "b", identity=ReplicaIdentity.FULL, key=())


def test_full_identity_is_a_multiset_with_exact_counts() -> None:
    b = batch(
        tx(ins(FULL, 1, "x"), ins(FULL, 1, "x"), ins(FULL, 2, "y")),
        tx(dele(FULL, 1, "x"), upd(FULL, 3, "z", old=(2, "y")), end=200),
    )
    net = net_of(b)
    assert isinstance(net, MultisetNet)
    deltas = {r.image: r.delta for r in net.rows.values()}
    assert deltas == {row(1, "x"): 1, row(3, "z"): 1}


def test_full_identity_update_fills_unchanged_toast_from_the_old_row() -> None:
    net = net_of(batch(tx(upd(FULL, 1, ..., old=(1, "big")))))
    assert isinstance(net, MultisetNet)
    assert {r.image: r.delta for r in net.rows.values()} == {}  # same row: net zero


def test_added_column_lines_up_images_by_name() -> None:
    before = relation("id", "v")
    after = relation("id", "v", "extra")
    net = keyed(
        batch(tx(ins(before, 1, "a"), ins(before, 2, "c")), tx(upd(after, 1, "b", "e"), end=200))
    )
    assert net.rows[(b"1",)].image == row(1, "b", "e")
    assert net.rows[(b"2",)].image == row(2, "c", None)  # laid out as the table is now


def test_a_chain_counts_its_changes_and_a_key_change_links_both_keys() -> None:
    net = keyed(
        batch(
            tx(ins(T, 1, "a", "x"), upd(T, 1, "b", "x"), upd(T, 3, "c", "x", old=(2, None, None)))
        )
    )
    assert net.rows[(b"1",)].changes == 2 and net.rows[(b"1",)].partner is None
    old, new = net.rows[(b"2",)], net.rows[(b"3",)]
    assert (old.changes, old.partner, new.changes, new.partner) == (1, (b"3",), 1, (b"2",))


def test_a_nets_bytes_are_its_rows_as_the_publisher_sent_them() -> None:
    """What a batch's writes are measured against: a written row's image, a deleted row's
    key, a multiset row's image once per copy."""
    from apply.batching.collapse import net_bytes

    net = keyed(batch(tx(ins(T, 1, "abc", "x"), upd(T, 2, "de", None), dele(T, 3, None, None))))
    assert net_bytes(net) == (1 + 3 + 1) + (1 + 2) + 1
    full = relation("id", "v", identity=ReplicaIdentity.FULL)
    multiset = net_of(batch(tx(ins(full, 1, "ab"), ins(full, 1, "ab"), dele(full, 2, "c"))))
    assert net_bytes(multiset) == 2 * (1 + 2) + (1 + 1)


def test_a_net_sent_to_a_writer_process_arrives_whole_and_in_order() -> None:
    """A writer process's net crosses as one plain tuple a row (``KeyedNet.__reduce__``):
    every field of every row, images, toast keys and partners, in the rows' order."""
    import pickle

    net = keyed(
        batch(
            tx(ins(T, 5, "a", "huge"), upd(T, 5, "b", ...), dele(T, 4, None, None)),
            tx(upd(T, 2, "c", ..., old=(1, None, None)), ins(T, 4, "again", "y"), end=200),
            tx(upd(T, 7, "d", ...), end=300),
        )
    )
    net.commits = [(100, 1), (200, 2), (300, 3)]
    sent = pickle.dumps(net)
    assert b"_keyed_net" in sent  # not the dataclass's own, a Python call a row and image
    back = pickle.loads(sent)
    assert back == net
    assert list(back.rows) == list(net.rows)
    assert [type(r.image) for r in back.rows.values()] == [type(r.image) for r in net.rows.values()]
    assert back.rows[(b"2",)].toast_key == (b"1",) and back.rows[(b"1",)].partner == (b"2",)
    assert back.rows[(b"4",)].reinserted and back.rows[(b"7",)].keeps_target_values


def test_a_keys_first_change_folds_alike_in_the_tables_layout_or_an_equal_one() -> None:
    """``fold_keyed`` makes a key's first INSERT or UPDATE in the table's latest layout
    without its general step; a Relation equal to it but not it takes the general step:
    the same rows either way, their first change, transaction and image."""
    same = relation("id", "v", "big")
    assert same == T and same is not T
    changes = [ins(T, 1, "a"), upd(T, 2, "b"), upd(T, 1, "c"), dele(T, 3), ins(T, 3, "d")]
    mixed = [ins(T, 1, "a"), upd(same, 2, "b"), upd(same, 1, "c"), dele(same, 3)]
    latest = keyed(batch(tx(*changes[:1]), tx(*changes[1:], end=200)))
    equal = keyed(batch(tx(*mixed[:1]), tx(*mixed[1:], ins(same, 3, "d"), end=200)))
    assert latest.rows == equal.rows
    one, two = latest.rows[(b"1",)], latest.rows[(b"2",)]
    assert (one.first, one.first_tx, one.changes, one.image) == (First.INSERT, 0, 2, row(1, "c"))
    assert (two.first, two.first_tx, two.changes, two.image) == (First.UPDATE, 1, 1, row(2, "b"))
    assert latest.rows[(b"3",)].first is First.DELETE and latest.rows[(b"3",)].reinserted
