"""A real Celery worker (prefork, two processes, Redis broker) sending with DispatchClient."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ..conftest import numbers
from ..simulator_thread import simulator_in_thread
from ..test_blocking import FORK_WARNING

celery = pytest.importorskip("celery")

ROOT = Path(__file__).resolve().parents[2]
TASKS = 200
PROCESSES = 2


@pytest.fixture(scope="module")
def worker_run(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Send TASKS tasks of each kind through a fresh worker; the results, stats and log."""
    log = tmp_path_factory.mktemp("celery") / "worker.log"
    prefix = f"celery-{uuid.uuid4().hex[:12]}:"
    with simulator_in_thread() as plain, simulator_in_thread() as shared:
        env = {
            **os.environ,
            "DISPATCH_TEST_BROKER": redis_server,
            "DISPATCH_TEST_PLAIN_URL": plain.url,
            "DISPATCH_TEST_SHARED_URL": shared.url,
            "DISPATCH_TEST_PREFIX": prefix,
            # Every warning shown once, ResourceWarning too; but not Python 3.12's about
            # forking a process with threads: forking is what the prefork pool does.
            "PYTHONWARNINGS": f"default,{FORK_WARNING}",
        }
        queue = f"dispatch-test-{uuid.uuid4().hex[:8]}"
        with log.open("w") as out:
            process = subprocess.Popen(  # noqa: S603 - our interpreter, fixed arguments
                [
                    sys.executable, "-m", "celery", "-A", "tests.fleet._celery_tasks",
                    "worker", "--pool=prefork", f"--concurrency={PROCESSES}",
                    "--loglevel=INFO", "-Q", queue, "-n", f"{queue}@%h",
                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                ],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            results = _send_all(redis_server, queue, prefix)
        finally:
            process.send_signal(signal.SIGTERM)  # a warm shutdown, as an operator does
            process.wait(timeout=60)
        yield {
            "results": results,
            "plain": plain.server.stats.token_calls,
            "shared": shared.server.stats.token_calls,
            "plain_sim": plain,
            "log": log.read_text(),
        }


def _send_all(broker: str, queue: str, prefix: str) -> dict[str, list[dict[str, Any]]]:
    """Queue the tasks, then wait for each one's outcome (pushed onto a Redis list)."""
    app = celery.Celery("dispatch_test_caller", broker=broker)
    app.conf.update(broker_connection_retry_on_startup=True, task_serializer="json")
    outcomes: dict[str, list[dict[str, Any]]] = {"plain": [], "shared": []}
    with app, redis.Redis.from_url(broker) as store:
        for index, kind in enumerate(outcomes):
            for number in numbers(TASKS, start=10_000 * index):
                app.send_task("send", args=[kind, number], queue=queue)
        for _ in range(2 * TASKS):
            popped = store.blpop([f"{prefix}outcomes"], timeout=60)
            if popped is None:
                pytest.fail(f"the worker stopped answering after {outcomes}")
            outcome = json.loads(popped[1])
            outcomes[outcome["kind"]].append(outcome)
    return outcomes


def test_every_task_succeeds_in_the_pools_processes(worker_run: dict[str, Any]) -> None:
    for kind in ("plain", "shared"):
        results = worker_run["results"][kind]
        assert [(r["ok"], r["valid"]) for r in results] == [(True, 1)] * TASKS, kind
    pids = {r["pid"] for kind in ("plain", "shared") for r in worker_run["results"][kind]}
    assert 1 <= len(pids) <= PROCESSES


def test_one_token_per_worker_process_or_one_in_all_with_a_token_store(
    worker_run: dict[str, Any],
) -> None:
    assert 1 <= worker_run["plain"] <= PROCESSES
    assert worker_run["shared"] == 1


def test_the_worker_log_has_no_warning(worker_run: dict[str, Any]) -> None:
    log: str = worker_run["log"]
    assert "ready." in log  # the worker did start and log
    # Celery's own warning when the worker runs as root (as CI does): not ours.
    root = ("superuser privileges", "SecurityWarning(ROOT_DISCOURAGED")
    lines = [line for line in log.splitlines() if not any(r in line for r in root)]
    for word in ("Warning", "WARNING", "ERROR", "Traceback", "unclosed", "Unclosed"):
        assert not [line for line in lines if word in line], log
