"""The benchmarks' used folders moved aside, removed once every scenario has run
(``benchmarks.harness.discard``): no inode freed between two measurements."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.harness import TRASH_VARIABLE, discard, shared_trash


def _made(root: Path) -> tuple[Path, int]:
    folder = root / "warehouse"
    (folder / "t1" / "_delta_log").mkdir(parents=True)
    commit = folder / "t1" / "_delta_log" / "00000000000000000000.json"
    commit.write_text("{}\n")
    return folder, commit.stat().st_ino


def test_a_discarded_folder_is_moved_whole_and_removed_when_the_shared_trash_ends(
    tmp_path: Path,
) -> None:
    folder, inode = _made(tmp_path)
    with shared_trash():
        trash = Path(os.environ[TRASH_VARIABLE])
        discard(folder)
        assert not folder.exists()
        [moved] = list(trash.iterdir())
        # Renamed, not copied: the same file, so nothing was freed yet.
        assert (moved / "t1" / "_delta_log" / "00000000000000000000.json").stat().st_ino == inode
    assert TRASH_VARIABLE not in os.environ
    assert not trash.exists()


def test_a_folder_that_cannot_be_moved_is_removed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _ = _made(tmp_path)
    monkeypatch.setenv(TRASH_VARIABLE, str(tmp_path / "no such folder"))
    discard(folder)
    assert not folder.exists()
    discard(folder)  # gone already: nothing to do
