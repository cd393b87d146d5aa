"""The test cluster's support (tests/support/kubernetes.py): a cluster a killed run left
behind is found and torn down before the next one starts, and a running run's is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.kubernetes import OWNER, STATE_PREFIX, abandoned


def test_a_cluster_whose_run_is_gone_is_abandoned_and_a_running_ones_is_not(
    tmp_path: Path,
) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    owners = {"running": str(os.getpid()), "ended": ended.stdout.strip(), "garbled": "x"}
    for name, owner in owners.items():
        state = tmp_path / f"{STATE_PREFIX}{name}"
        state.mkdir()
        (state / OWNER).write_text(owner)
    (tmp_path / f"{STATE_PREFIX}unrecorded").mkdir()  # started by a tree before the owner
    (tmp_path / "another-folder").mkdir()

    found = [state.name.removeprefix(STATE_PREFIX) for state in abandoned(tmp_path)]

    assert found == ["ended", "garbled", "unrecorded"]
