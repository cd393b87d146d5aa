"""pytest fixtures for real PostgreSQL servers.

- ``publisher``: a fresh database on the run's PostgreSQL 15 publisher.
- ``publisher_any``: the same, once per installed major (15 from Debian,
  others from npm's embedded builds), for protocol-version coverage.
- ``native_subscriber``: a fresh database on a second cluster, where tests
  run PostgreSQL's own ``CREATE SUBSCRIPTION`` as the behaviour reference.
- ``pg_cluster``: a factory for clusters of any major with custom settings,
  stopped at the end of the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.pgcluster import DEFAULT_MAJOR, PgCluster, available_majors
from tests.support.pgdatabase import PgDatabase


class _Clusters:
    """Session-wide clusters, one per (role, major), started on first use."""

    def __init__(self) -> None:
        self._running: dict[tuple[str, int], PgCluster] = {}

    def get(self, role: str, major: int) -> PgCluster:
        key = (role, major)
        if key not in self._running:
            self._running[key] = PgCluster(major=major).start()
        return self._running[key]

    def close(self) -> None:
        for cluster in self._running.values():
            cluster.destroy()


@pytest.fixture(scope="session")
def pg_clusters() -> Iterator[_Clusters]:
    clusters = _Clusters()
    yield clusters
    clusters.close()


@pytest.fixture
def publisher(pg_clusters: _Clusters) -> Iterator[PgDatabase]:
    db = PgDatabase.create(pg_clusters.get("publisher", DEFAULT_MAJOR), "pub")
    yield db
    db.drop()


@pytest.fixture(params=available_majors(), ids=lambda major: f"pg{major}")
def publisher_any(request: pytest.FixtureRequest, pg_clusters: _Clusters) -> Iterator[PgDatabase]:
    db = PgDatabase.create(pg_clusters.get("publisher", int(request.param)), "pub")
    yield db
    db.drop()


@pytest.fixture
def native_subscriber(pg_clusters: _Clusters) -> Iterator[PgDatabase]:
    db = PgDatabase.create(pg_clusters.get("subscriber", DEFAULT_MAJOR), "sub")
    yield db
    db.drop()


@pytest.fixture
def pg_cluster() -> Iterator[Callable[..., PgCluster]]:
    started: list[PgCluster] = []

    def start(major: int = DEFAULT_MAJOR, **settings: str) -> PgCluster:
        cluster = PgCluster(major=major, settings=settings).start()
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.destroy()
