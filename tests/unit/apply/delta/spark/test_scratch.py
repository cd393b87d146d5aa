"""The Spark JVM's scratch folder: held by its process while it lives, removed after it,
however it ends (processes of their own, killed as the kernel kills them)."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from apply.delta.spark.scratch import Reclaimed, ScratchError, claim

# A process that claims a folder under argv[1], writes a megabyte there, says where, and
# waits for a line on stdin (or its end) to exit.
_HOLDER = """
import sys
from pathlib import Path
from apply.delta.spark.scratch import claim
folder, _ = claim(Path(sys.argv[1]))
(folder / "blocks").write_bytes(bytes(2**20))
print(folder, flush=True)
sys.stdin.readline()
"""


def _holder(root: Path) -> tuple[subprocess.Popen[str], Path]:
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[5],
    )
    assert process.stdout is not None
    return process, Path(process.stdout.readline().strip())


def test_a_killed_process_folder_is_removed_by_the_next_claim_a_living_ones_kept(
    tmp_path: Path,
) -> None:
    root = tmp_path / "pgsub-1000" / "scratch"
    killed, gone = _holder(root)
    living, kept = _holder(root)
    try:
        assert gone.parent == root and gone != kept
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert gone.is_dir()  # nothing of the process could remove it

        mine, reclaimed = claim(root)
        assert not gone.exists()
        assert reclaimed == Reclaimed(folders=1, bytes=2**20)
        assert kept.is_dir() and (kept / "blocks").is_file()  # its process holds it
        assert mine.is_dir() and mine.name.startswith(f"{os.getpid()}-")
    finally:
        if killed.poll() is None:  # an assertion failed before its kill: none left behind
            killed.kill()
            killed.wait()
        living.communicate("\n", timeout=60)
    # A process that exits removes its own folder.
    assert living.returncode == 0 and not kept.exists()


def test_a_folder_open_to_others_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "pgsub-1000"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ScratchError, match=r"must be this user.s .* with mode 700"):
        claim(shared / "scratch")
    assert not (shared / "scratch").exists()


def test_a_file_system_without_locks_is_named_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some network and FUSE file systems refuse flock (ENOLCK): a clear error at start, not
    a traceback."""

    def refused(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refused)
    root = tmp_path / "pgsub-1000" / "scratch"
    with pytest.raises(
        ScratchError, match=r"cannot make or lock .* No locks available; set TMPDIR"
    ):
        claim(root)
