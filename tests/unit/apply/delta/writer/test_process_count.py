"""``writer_processes: auto``: two writer processes for a subscription of many tables when the
daemon may use two cores, by its cgroup's CPU quota (a container's limit), not the node's
count (``merge_processes.auto_processes``, ``usable_cpus``)."""

from __future__ import annotations

import os
from pathlib import Path

from apply.delta.writer.merge_processes import AUTO_TABLES, auto_processes, usable_cpus


def test_auto_runs_two_processes_for_many_tables_on_two_cores() -> None:
    assert auto_processes(AUTO_TABLES, cpus=2) == 2
    assert auto_processes(1_000, cpus=16) == 2
    assert auto_processes(AUTO_TABLES - 1, cpus=16) == 0  # a few tables: the threads
    assert auto_processes(1_000, cpus=1) == 0  # one core: no lock to share out


def _cgroup(root: Path, folder: str, name: str, text: str) -> None:
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(text)


def test_a_cgroup_v2_quota_bounds_the_cores(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    membership = "0::/kubepods/pod1/c1\n"
    assert usable_cpus(membership, tmp_path) == affinity  # no cgroup files: the affinity
    _cgroup(tmp_path, "kubepods/pod1/c1", "cpu.max", "max 100000\n")
    assert usable_cpus(membership, tmp_path) == affinity  # no limit
    _cgroup(tmp_path, "kubepods/pod1", "cpu.max", "50000 100000\n")  # the pod's: half a core
    assert usable_cpus(membership, tmp_path) == 1
    _cgroup(tmp_path, "kubepods/pod1", "cpu.max", "150000 100000\n")  # 1.5 cores: rounded up
    assert usable_cpus(membership, tmp_path) == min(affinity, 2)


def test_a_cgroup_v1_quota_bounds_the_cores(tmp_path: Path) -> None:
    membership = "5:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n0::/\n"
    _cgroup(tmp_path, "cpu,cpuacct/docker/x", "cpu.cfs_quota_us", "100000\n")
    _cgroup(tmp_path, "cpu,cpuacct/docker/x", "cpu.cfs_period_us", "100000\n")
    assert usable_cpus(membership, tmp_path) == 1
    _cgroup(tmp_path, "cpu,cpuacct/docker/x", "cpu.cfs_quota_us", "-1\n")  # none
    assert usable_cpus(membership, tmp_path) == len(os.sched_getaffinity(0))
