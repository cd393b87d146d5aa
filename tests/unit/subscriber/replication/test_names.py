"""Every (schema, table) has its own name and its own folder under the warehouse."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subscriber.replication.names import path_part, qualified_name, split_qualified, table_folder

identifiers = st.text(min_size=1, max_size=12).filter(lambda s: "\x00" not in s)


def test_plain_names_keep_their_text_and_their_folders() -> None:
    assert qualified_name("public", "orders") == "public.orders"
    assert table_folder("public.orders") == "public/orders"
    assert table_folder(qualified_name("sales", "Order_Lines$2")) == "sales/Order_Lines$2"


def test_names_that_once_collided_have_their_own_folders() -> None:
    one, other = qualified_name("a.b", "c"), qualified_name("a", "b.c")
    assert one == '"a.b".c' and other == 'a."b.c"'
    assert table_folder(one) == "a~2Eb/c" and table_folder(other) == "a/b~2Ec"


@pytest.mark.parametrize("name", ["..", "../../etc", "x/y", "~2E", "_pgsub"])
def test_no_name_leaves_the_warehouse_or_takes_the_state_folder(name: str) -> None:
    folder = table_folder(qualified_name(name, name))
    assert "/" not in path_part(name) and ".." not in folder
    assert not folder.startswith("_pgsub/")


def test_a_bare_table_is_in_public_and_bad_names_are_refused() -> None:
    assert split_qualified("t") == ("public", "t")
    with pytest.raises(ValueError):
        split_qualified('"open')
    with pytest.raises(ValueError):
        split_qualified("a.b.c")


@given(identifiers, identifiers, identifiers, identifiers)
def test_names_and_folders_are_one_to_one(s1: str, t1: str, s2: str, t2: str) -> None:
    assert split_qualified(qualified_name(s1, t1)) == (s1, t1)
    if (s1, t1) != (s2, t2):
        assert qualified_name(s1, t1) != qualified_name(s2, t2)
        assert table_folder(qualified_name(s1, t1)) != table_folder(qualified_name(s2, t2))
