"""A copy's progress for /status (tablesync/copy_progress.py): rate and time left while it runs."""

from tablesync.copy_progress import CopyProgress


def test_rate_and_time_left_while_the_worker_runs_only() -> None:
    now = [100.0]
    progress = CopyProgress(lambda: now[0])
    assert progress.figures(1, running=True) == {
        "rows_copied": None,
        "rows_estimated": None,
        "copy_rows_per_second": None,
        "copy_seconds_left": None,
    }
    progress.note(1, 0, 1000)
    now[0] = 102.0
    progress.note(1, 500, 1000)
    assert progress.figures(1, running=True) == {
        "rows_copied": 500,
        "rows_estimated": 1000,
        "copy_rows_per_second": 250.0,
        "copy_seconds_left": 2.0,
    }
    finished = progress.figures(1, running=False)  # the worker is gone: no rate, rows kept
    assert finished["rows_copied"] == 500 and finished["copy_rows_per_second"] is None
    progress.note(2, 10, 0)  # no estimate: a rate, no time left
    now[0] = 103.0
    assert progress.figures(2, running=True)["copy_seconds_left"] is None
    assert progress.figures(2, running=True)["copy_rows_per_second"] == 10.0
