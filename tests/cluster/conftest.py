"""Fixtures for the class-scale tests: real services, stopped at the end of the session."""

from __future__ import annotations

import pytest
from clustertools import LEARNER_CELL_TIMEOUT, DaskCluster, Postgres


@pytest.fixture(scope="session")
def postgres():
    pg = Postgres()
    yield pg
    pg.close()


@pytest.fixture(scope="session")
def dask_cluster(tmp_path_factory):
    cluster = DaskCluster(2, tmp_path_factory.mktemp("dask-logs"),
                          env={"PALLAS_COURSE_CELL_TIMEOUT": LEARNER_CELL_TIMEOUT})
    yield cluster
    cluster.close()
