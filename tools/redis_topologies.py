"""Real Redis topologies on 127.0.0.1, without pytest: a 3-primary, 3-replica Cluster,
a Sentinel set (1 primary, 1 replica, 3 sentinels) and a TLS-only Redis.

Each is a group of ``redis-server`` processes in a directory, started when its block
begins and stopped at its end. Shared by the fleet tests (tests/fleet/conftest.py, which
turns a missing program into a skip, or a failure in CI) and the chaos benchmark
(benchmarks/chaos.py ``--cluster``).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

#: Seconds a topology may take to come up.
START_WAIT = 30.0


def free_ports(count: int) -> list[int]:
    """*count* distinct free ports on 127.0.0.1 (a cluster node also takes port + 10000)."""
    ports: list[int] = []
    sockets = []
    try:
        while len(ports) < count:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            port = sock.getsockname()[1]
            if port + 10000 < 65536:
                ports.append(port)
    finally:
        for sock in sockets:
            sock.close()
    return ports


class MissingProgram(LookupError):
    """A program a topology needs is not on PATH."""


def binary(name: str) -> str:
    """The path of *name*, or `MissingProgram`."""
    found = shutil.which(name)
    if found is None:
        raise MissingProgram(
            f"{name} is not on PATH (apt-get install -y redis-server redis-sentinel)"
        )
    return found


def cli(port: int, *args: str, tls: list[str] | None = None) -> str:
    """redis-cli's answer to *args* on *port* ("" if it failed)."""
    done = subprocess.run(  # noqa: S603 - redis-cli from PATH, fixed arguments
        [binary("redis-cli"), "-h", "127.0.0.1", "-p", str(port), *(tls or []), *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return done.stdout if done.returncode == 0 else ""


def wait_for(what: str, check: Callable[[], bool]) -> None:
    """Poll *check* until it is true, for `START_WAIT` seconds at most."""
    deadline = time.monotonic() + START_WAIT
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {START_WAIT:.0f} s")
        time.sleep(0.05)


@attrs.define
class Servers:
    """redis-server processes in one directory, stopped together."""

    directory: Path
    processes: list[subprocess.Popen[bytes]] = attrs.Factory(list)

    def start(self, name: str, *args: str, program: str = "redis-server") -> None:
        log = self.directory / f"{name}.log"
        self.processes.append(
            subprocess.Popen(  # noqa: S603 - redis-server from PATH, fixed arguments
                [binary(program), *args, "--dir", str(self.directory), "--logfile", str(log)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


_COMMON = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no")


@attrs.frozen
class Cluster:
    """A running cluster: its nodes' ports (primaries first)."""

    ports: list[int]

    @property
    def url(self) -> str:
        """The URL of one node (any node works)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def replica_of(self, primary_port: int) -> int:
        """The port of *primary_port*'s replica."""
        node_id = cli(primary_port, "cluster", "myid").strip()
        for line in cli(primary_port, "cluster", "nodes").splitlines():
            fields = line.split()
            if len(fields) > 3 and fields[3] == node_id:
                return int(fields[1].split(":")[1].split("@")[0])
        raise AssertionError(f"no replica of {primary_port}")

    def primary_for(self, key: str) -> int:
        """The port of the primary serving *key*."""
        slot = int(cli(self.ports[0], "cluster", "keyslot", key).strip())
        for line in cli(self.ports[0], "cluster", "nodes").splitlines():
            fields = line.split()
            if "master" not in fields[2]:
                continue
            for span in fields[8:]:
                low, _, high = span.partition("-")
                if int(low) <= slot <= int(high or low):
                    return int(fields[1].split(":")[1].split("@")[0])
        raise AssertionError(f"no primary serves {key}")

    def fail_over(self, primary_port: int) -> int:
        """Promote *primary_port*'s replica (``CLUSTER FAILOVER``): its port, once serving."""
        replica = self.replica_of(primary_port)
        assert cli(replica, "cluster", "failover").strip() == "OK"
        wait_for(
            "the failover",
            check=lambda: (
                "role:master" in cli(replica, "info", "replication")
                and all("cluster_state:ok" in cli(p, "cluster", "info") for p in self.ports)
            ),
        )
        return replica


def _settled(port: int) -> bool:
    """Whether the node on *port* sees the whole cluster: ok, 3 primaries, 3 replicas."""
    if "cluster_state:ok" not in cli(port, "cluster", "info"):
        return False
    nodes = [line.split() for line in cli(port, "cluster", "nodes").splitlines()]
    roles = sorted("master" if "master" in n[2] else "slave" for n in nodes if n[7] == "connected")
    return roles == ["master"] * 3 + ["slave"] * 3


@contextlib.contextmanager
def running_cluster(directory: Path) -> Iterator[Cluster]:
    """3 primaries, 3 replicas on 127.0.0.1."""
    servers = Servers(directory)
    ports = free_ports(6)
    try:
        for port in ports:
            servers.start(
                f"node-{port}",
                *_COMMON,
                "--port",
                str(port),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(directory / f"nodes-{port}.conf"),
                "--cluster-node-timeout",
                "2000",
            )
        for port in ports:
            wait_for(f"cluster node {port}", check=lambda p=port: cli(p, "ping").strip() == "PONG")
        created = cli(
            ports[0],
            "--cluster",
            "create",
            *(f"127.0.0.1:{p}" for p in ports),
            "--cluster-replicas",
            "1",
            "--cluster-yes",
        )
        assert "All 16384 slots covered" in created, created
        wait_for("the cluster", check=lambda: all(_settled(p) for p in ports))
        cluster = Cluster(ports)
        yield cluster
    finally:
        servers.stop()


@attrs.frozen
class SentinelSet:
    """A running Sentinel set watching one primary (service ``mymaster``)."""

    primary: int
    replica: int
    sentinels: list[int]
    service: str = "mymaster"

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def current_primary(self) -> int:
        answer = cli(self.sentinels[0], "sentinel", "get-master-addr-by-name", self.service)
        return int(answer.split()[1])

    def fail_over(self) -> int:
        """Promote the replica (``SENTINEL FAILOVER``): the new primary's port, once serving.

        It waits first for an earlier failover's old primary to replicate (only a
        replica can be promoted)."""
        old, _ = self.settled()
        assert cli(self.sentinels[0], "sentinel", "failover", self.service).strip() == "OK"
        wait_for(
            "the Sentinel failover",
            check=lambda: (
                self.current_primary() != old
                and "role:master" in cli(self.current_primary(), "info", "replication")
            ),
        )
        return self.current_primary()

    def settled(self) -> tuple[int, int]:
        """The primary's and the replica's ports, once the replica replicates the primary
        (after a failover the old primary takes writes until the sentinels demote it)."""
        found: list[int] = []

        def replicating() -> bool:
            primary = self.current_primary()
            (replica,) = {self.primary, self.replica} - {primary}
            found[:] = [primary, replica]
            replication = cli(replica, "info", "replication")
            return "role:slave" in replication and "master_link_status:up" in replication

        wait_for("the Sentinel set to settle", check=replicating)
        return found[0], found[1]


@contextlib.contextmanager
def running_sentinels(directory: Path) -> Iterator[SentinelSet]:
    """1 primary, 1 replica, 3 sentinels on 127.0.0.1."""
    servers = Servers(directory)
    primary, replica, *sentinels = free_ports(5)
    try:
        servers.start("primary", *_COMMON, "--port", str(primary))
        servers.start(
            "replica", *_COMMON, "--port", str(replica), "--replicaof", "127.0.0.1", str(primary)
        )
        wait_for(
            "the replica",
            check=lambda: "master_link_status:up" in cli(replica, "info", "replication"),
        )
        for port in sentinels:
            config = directory / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor mymaster 127.0.0.1 {primary} 2\n"
                "sentinel down-after-milliseconds mymaster 2000\n"
                "sentinel failover-timeout mymaster 10000\n"
            )
            servers.start(f"sentinel-{port}", str(config), "--sentinel", "--daemonize", "no")
        found = SentinelSet(primary, replica, sentinels)
        wait_for(
            "the sentinels",
            check=lambda: all(
                "num-other-sentinels\n2" in cli(p, "sentinel", "master", "mymaster")
                and "num-slaves\n1" in cli(p, "sentinel", "master", "mymaster")
                for p in sentinels
            ),
        )
        yield found
    finally:
        servers.stop()


@attrs.frozen
class TlsRedis:
    """A Redis that speaks only TLS, its certificate signed by a private CA."""

    port: int
    ca_file: Path

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"


@contextlib.contextmanager
def running_tls_redis(directory: Path) -> Iterator[TlsRedis]:
    """A TLS-only redis-server (port 0 for plain TCP), with a trustme CA."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    servers = Servers(directory)
    (port,) = free_ports(1)
    tls = ["--tls", "--cacert", str(ca_file)]
    try:
        servers.start(
            "tls",
            *_COMMON,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--tls-cert-file",
            str(cert_file),
            "--tls-key-file",
            str(key_file),
            "--tls-ca-cert-file",
            str(ca_file),
            "--tls-auth-clients",
            "no",
        )
        wait_for("the TLS Redis", check=lambda: cli(port, "ping", tls=tls).strip() == "PONG")
        yield TlsRedis(port, ca_file)
    finally:
        servers.stop()
