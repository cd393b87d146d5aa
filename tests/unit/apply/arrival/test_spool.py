"""The spool directory holds row data: only this user's, never someone else's."""

from pathlib import Path

import pytest

from apply.arrival.spool import SpoolDirectory, private_directory
from apply.arrival.spool_frames import SpoolError


def test_the_spool_directory_is_made_private_and_emptied(tmp_path: Path) -> None:
    root = tmp_path / "spool" / "apply"
    root.mkdir(parents=True)
    (root / "tx-1").write_bytes(b"left by a killed run")
    SpoolDirectory(root)
    assert list(root.iterdir()) == [] and root.stat().st_mode & 0o777 == 0o700


def test_a_directory_open_to_others_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "pgsub-1000"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(SpoolError, match=r"must be this user.s .* with mode 700"):
        private_directory(shared)
