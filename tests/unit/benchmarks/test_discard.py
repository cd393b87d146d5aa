"""The benchmarks' used folders moved aside, removed once every scenario has run
(``benchmarks.harness.discard``): no inode freed between two measurements."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import TRASH_VARIABLE, discard, shared_trash
from subscriber.runtime.config_file import apply_environment

ROOT = Path(__file__).resolve().parents[3]


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


def test_a_process_without_a_shared_trash_empties_its_own_as_it_exits(tmp_path: Path) -> None:
    folder, _ = _made(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != TRASH_VARIABLE}
    env["TMPDIR"] = str(tmp_path)  # where the process makes its own trash
    code = "import sys; from benchmarks.harness import discard; discard(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True, env=env, cwd=ROOT)
    assert not folder.exists()
    assert not list(tmp_path.glob("pgsub-bench-trash-*"))  # emptied and removed at exit


def test_a_pgsub_started_within_the_shared_trash_reads_its_config() -> None:
    """A scenario's ``pgsub run`` (the cold start) inherits the trash's variable: it must not
    be one pgsub reads as a config key (``PGSUB_BENCH_TRASH`` was: "names no config key",
    and ``make bench`` stopped at the cold start)."""
    with shared_trash():
        assert TRASH_VARIABLE in os.environ
        assert apply_environment({"warehouse": "/w"}, os.environ) == {"warehouse": "/w"}
