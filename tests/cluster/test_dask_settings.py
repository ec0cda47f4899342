"""The Dask cluster that grades runs with deploy/dask/grading.yaml, as setup-class.sh installs
it: without those settings Dask's own housekeeping cost a worker about a tenth of a core beside
each submission, and a worker imported nbformat in its first submission (bench/grading.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # the session's Dask cluster (conftest.dask_cluster)


def test_workers_run_with_the_grading_settings(dask_cluster):
    import dask
    from distributed import Client

    # defined here, so that they travel by value: the workers cannot import this module
    def worker_settings(dask_worker) -> dict:
        import sys

        return {"preloaded": "nbformat" in sys.modules
                and "grader.logistics.cluster" in sys.modules,
                "profiler": "profile" in dask_worker.periodic_callbacks}

    def scheduler_settings(dask_scheduler) -> dict:
        return {"saturation": dask_scheduler.WORKER_SATURATION,
                "stealing": "stealing" in dask_scheduler.extensions}

    with dask.config.set(dask_cluster.client_config), \
            Client(dask_cluster.address, timeout="30s") as client:
        workers = client.run(worker_settings)
        scheduler = client.run_on_scheduler(scheduler_settings)
    assert workers and all(w == {"preloaded": True, "profiler": False}
                           for w in workers.values()), workers
    # one submission per worker at a time, handed out as each finishes: none waits on a busy
    # worker while another is idle
    assert scheduler == {"saturation": 1.0, "stealing": False}, scheduler


def test_no_dask_process_serves_http(dask_cluster):
    """Issue 35, item 12: Dask's HTTP pages (workers, logs, exceptions) answered any account on
    the machine, without TLS or a login, from the scheduler and every worker."""
    import socket

    import dask
    from distributed import Client

    def http_port(dask_worker=None, dask_scheduler=None) -> int:
        return (dask_worker or dask_scheduler).http_server.port

    with dask.config.set(dask_cluster.client_config), \
            Client(dask_cluster.address, timeout="30s") as client:
        ports = [*client.run(http_port).values(), client.run_on_scheduler(http_port)]
        # every worker the scheduler has (the session's cluster may have lost or retired some
        # that other tests added) and the scheduler
        assert len(ports) == len(client.scheduler_info()["workers"]) + 1 >= 2
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, port
