"""The Redis of a chaos run (benchmarks/chaos.py), and the run's own client to it.

A single ``redis-server`` with an append-only file, stopped and started at will; or a
3-primary, 3-replica Redis Cluster (tools/redis_topologies.py) whose disruption is the
failover of one primary.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.daemon import free_port  # noqa: E402 - the repository's root, put on the path above
from tools.redis_topologies import MissingProgram, cli, running_cluster  # noqa: E402

__all__ = ["ClusterRedis", "Redis", "Watcher"]


class Redis:
    """A throwaway redis-server with an append-only file; its disruption is a restart."""

    #: Whether keys used together need a hash tag (``tag``).
    cluster = False
    #: Whether the disruption waits for the producer (a restart would fail it).
    waits_for_producer = True
    prefix = "chaos:"

    def __init__(self, data: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            sys.exit("redis-server is not on PATH (apt-get install -y redis-server)")
        self.binary = binary
        self.port = free_port()
        self.data = data
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(  # noqa: S603 - redis-server, fixed arguments
            [
                *(self.binary, "--bind", "127.0.0.1", "--port", str(self.port)),
                *("--dir", str(self.data), "--appendonly", "yes", "--save", ""),
            ],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(500):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.02)
        sys.exit("redis-server did not start")

    def stop(self) -> None:
        assert self.process is not None
        self.process.terminate()  # a clean shutdown: the append-only file is flushed
        self.process.wait(timeout=30)

    def tag(self, text: str) -> str:
        """The start of keys used together, as the fleet writes it (no hash tag)."""
        return text

    def disrupt(self, key: str, down_for: float) -> None:
        """Stop Redis, leave it down *down_for* seconds, start it again with its data."""
        self.stop()
        time.sleep(down_for)
        self.start()

    def pids(self) -> list[int]:
        assert self.process is not None
        return [self.process.pid]

    def report(self, disrupted_at: float | None) -> dict[str, Any]:
        return {"redis_restarted_at_s": disrupted_at}


class ClusterRedis:
    """A throwaway Redis Cluster; its disruption is a failover of one primary, while the
    producer may still be adding chunks."""

    cluster = True
    waits_for_producer = False

    def __init__(self, data: Path) -> None:
        self._stack = contextlib.ExitStack()
        atexit.register(self._stack.close)  # a run that exits early stops the nodes too
        try:
            self.cluster = self._stack.enter_context(running_cluster(data))
        except MissingProgram as exc:
            sys.exit(str(exc))
        self.url = self.cluster.url
        self.prefix = self._prefix_on_one_primary()
        self.failed_over: dict[str, Any] = {}

    def pids(self) -> list[int]:
        return [
            int(line.split(":")[1])
            for port in self.cluster.ports
            for line in cli(port, "info", "server").splitlines()
            if line.startswith("process_id:")
        ]

    def _prefix_on_one_primary(self) -> str:
        """A key prefix whose token and limit (``{P}``), chunk stream (``{Pchunks}``) and
        job (``{Pjob:chaos}``) keys one primary serves: its failover then hits them all."""
        for attempt in itertools.count():
            prefix = f"chaos{attempt}:"
            tags = (prefix, f"{prefix}chunks", f"{prefix}job:chaos")
            if len({self.cluster.primary_for(f"{{{tag}}}") for tag in tags}) == 1:
                return prefix
        raise AssertionError  # pragma: no cover - itertools.count never ends

    def tag(self, text: str) -> str:
        """The start of keys used together, as the fleet writes it on a Cluster."""
        return f"{{{text}}}"

    def disrupt(self, key: str, down_for: float) -> None:
        """Promote the replica of the primary serving *key*, noting how long it took
        (nothing is down: *down_for* is the restart's)."""
        primary = self.cluster.primary_for(key)
        began = time.monotonic()
        replica = self.cluster.fail_over(primary)
        self.failed_over = {
            "primary": primary,
            "promoted": replica,
            "seconds": round(time.monotonic() - began, 2),
            "keys_it_served": "the token, the limit, the chunk stream, the job",
        }

    def stop(self) -> None:
        self._stack.close()

    def report(self, disrupted_at: float | None) -> dict[str, Any]:
        failover = self.failed_over and {"at_s": disrupted_at, **self.failed_over}
        return {"redis": "cluster: 3 primaries, 3 replicas", "failover": failover}


class Watcher:
    """The run's own view of Redis: one client for the whole run, made anew after a
    failure (a client a poll would cost a Cluster client's start, the command table
    read, ten times a second: CPU the fleet then lacks)."""

    def __init__(self, url: str, cluster: bool) -> None:
        self.url = url
        self.cluster = cluster
        self._client: Any = None

    def __call__(self, what: Any) -> Any:
        """*what*(redis) once Redis answers (it may be restarting, or failing over)."""
        import redis
        import redis.cluster
        import redis.exceptions

        while True:
            try:
                if self._client is None:
                    kind = redis.cluster.RedisCluster if self.cluster else redis.Redis
                    self._client = kind.from_url(self.url)
                return what(self._client)
            except (redis.exceptions.RedisError, OSError):
                self.close()
                time.sleep(0.1)

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
