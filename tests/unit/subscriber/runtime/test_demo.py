"""``pgsub demo`` starts clean: what an earlier run left is removed, anything else refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from subscriber.replication.errors import UsageError
from subscriber.runtime.demo import clear_previous_run


def test_an_earlier_demos_tables_and_state_are_removed(tmp_path: Path) -> None:
    for folder in ("_pgsub/tables/_delta_log", "public/accounts/_delta_log", "public/events"):
        (tmp_path / folder).mkdir(parents=True)
    clear_previous_run(tmp_path)
    assert list(tmp_path.iterdir()) == []
    clear_previous_run(tmp_path / "never made")  # a first run: nothing to do


def test_a_warehouse_holding_anything_else_is_refused_untouched(tmp_path: Path) -> None:
    (tmp_path / "_pgsub").mkdir()
    (tmp_path / "public" / "orders").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"public/orders.*--warehouse <empty folder>"):
        clear_previous_run(tmp_path)
    assert (tmp_path / "_pgsub").is_dir() and (tmp_path / "public" / "orders").is_dir()
