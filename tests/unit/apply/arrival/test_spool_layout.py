"""The spool's folders have one owner (apply/arrival/spool_layout.py); a start keeps what
resumes."""

from pathlib import Path

from apply.arrival.spool_layout import SpoolLayout


def test_each_kind_of_file_has_its_own_folder_and_a_start_keeps_resumable_copies() -> None:
    layout = SpoolLayout(Path("/spool"))
    folders = {
        layout.leader,
        layout.sync_worker(16384),
        layout.staging,
        layout.copy(16384),
        layout.ranges_of(16384),
    }
    assert len(folders) == 5 and all(f.is_relative_to(layout.root) for f in folders)
    removed = layout.left_by_a_killed_run
    assert layout.staging in removed and layout.copy(16384).parent in removed
    assert not any(layout.ranges_of(16384).is_relative_to(r) for r in removed)
    assert not any(layout.leader.is_relative_to(r) for r in removed)
