"""Fixtures for the class-scale tests: a course copy, and real services stopped at the end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from services import DaskCluster, Postgres

REPO = Path(__file__).resolve().parents[2]
A = "01_first_kernel"
# learner cells get this many seconds instead of 60: a dying or looping submission ends sooner
LEARNER_CELL_TIMEOUT = "5"


def new_course(dest: Path) -> Path:
    """A course folder like exercises/ (config, sources, reference cases), not yet released."""
    dest.mkdir(parents=True)
    for name in ("source", "refs"):
        shutil.copytree(REPO / "exercises" / name, dest / name,
                        ignore=shutil.ignore_patterns("*.ipynb"))
    shutil.copy(REPO / "exercises" / "nbgrader_config.py", dest)
    return dest


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
