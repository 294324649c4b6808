"""A local Redis for development and tests: Debian's ``redis-server`` on loopback, one server or a
cluster, with AOF ``everysec`` as production should run it.

    with RedisServer.start(workdir) as redis:
        print(redis.url)
"""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from stream_ndcg.devtools.ports import LOOPBACK, free_port
from stream_ndcg.devtools.servers import LocalServer, LocalServers, wait_for_ready


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a server certificate and the CA that signed it."""

    ca: Path
    cert: Path
    key: Path


@dataclass
class RedisServer(LocalServer):
    """redis-server on loopback with AOF (appendfsync everysec); TLS only, if `tls` is given;
    a cluster node (not yet given slots) if `cluster`."""

    workdir: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    tls: TlsFiles | None = None
    cluster: bool = False
    # The cluster bus port: by default the port + 10000, out of range for high free ports.
    bus_port: int = field(default_factory=free_port)
    # A replica of the server on this port (--replicaof), or None.
    replica_of: int | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{LOOPBACK}:{self.port}/0"

    @classmethod
    def start(cls, workdir: Path, port: int | None = None, *, detach: bool = False,
              tls: TlsFiles | None = None, cluster: bool = False, replica_of: int | None = None) -> RedisServer:
        server = cls(Path(workdir), port or free_port(), tls=tls, cluster=cluster, replica_of=replica_of)
        server.workdir.mkdir(parents=True, exist_ok=True)
        server.launch(detach=detach)
        return server

    def launch(self, *, detach: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        log = self.workdir / "redis.log"
        listen = ["--port", str(self.port)]
        if self.tls:
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.tls.cert),
                      "--tls-key-file", str(self.tls.key), "--tls-ca-cert-file", str(self.tls.ca),
                      "--tls-auth-clients", "no"]
        if self.cluster:
            # nodes.conf in the node's own directory: a restarted node rejoins with its slots.
            listen += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                       "--cluster-node-timeout", "5000", "--cluster-port", str(self.bus_port)]
        if self.replica_of is not None:
            listen += ["--replicaof", LOOPBACK, str(self.replica_of)]
        self.process = subprocess.Popen(  # noqa: S603
            [binary, "--bind", LOOPBACK, *listen, "--dir", str(self.workdir),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--logfile", str(log), "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=detach,
        )
        wait_for_ready("redis-server", self._ready, 30, self.process, log)

    def _ready(self) -> bool:
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=1) as raw:
                if not self.tls:
                    raw.sendall(b"PING\r\n")
                    return raw.recv(64).startswith((b"+PONG", b"-NOAUTH"))
                context = ssl.create_default_context(cafile=str(self.tls.ca))
                with context.wrap_socket(raw, server_hostname=LOOPBACK) as sock:
                    sock.sendall(b"PING\r\n")
                    return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def restart(self) -> None:
        self.stop()
        self.launch()

    def wait_until_in_sync(self, timeout: float = 60) -> None:
        """For a replica: until its link to the master is up (the first sync done)."""
        deadline = time.monotonic() + timeout
        while b"master_link_status:up" not in (_ask(self.port, "INFO replication") or b""):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replica on port {self.port} not in sync after {timeout:.0f}s")
            time.sleep(0.2)

    def cluster_state(self) -> str | None:
        """This node's cluster_state (ok or fail), or None if it does not answer."""
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=1) as sock:
                sock.sendall(b"CLUSTER INFO\r\n")
                reply = b""
                while b"cluster_state:" not in reply or not reply.endswith(b"\r\n"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return None
        for line in reply.decode(errors="replace").splitlines():
            if line.startswith("cluster_state:"):
                return line.partition(":")[2]
        return None


@dataclass
class RedisClusterNodes(LocalServers):
    """A Redis Cluster of `masters` redis-server nodes on loopback, each with `replicas` replicas
    (none by default), its 16384 slots shared out by `redis-cli --cluster create`. A replica takes
    over its master's slots within seconds of the master's death (`--cluster-node-timeout`)."""

    nodes: list[RedisServer]

    @property
    def url(self) -> str:
        """Any one node: the client discovers the others from it."""
        return self.nodes[0].url

    @classmethod
    def start(cls, workdir: Path, masters: int = 3, *, replicas: int = 0, detach: bool = False) -> RedisClusterNodes:
        redis_cli = shutil.which("redis-cli")
        if redis_cli is None:
            raise RuntimeError("redis-cli is not installed (Debian: apt-get install redis-tools)")
        cluster = cls([])
        try:
            for index in range(masters * (1 + replicas)):
                cluster.nodes.append(RedisServer.start(Path(workdir) / f"node-{index}", cluster=True, detach=detach))
            addresses = [f"{LOOPBACK}:{node.port}" for node in cluster.nodes]
            subprocess.run([redis_cli, "--cluster", "create", *addresses,  # noqa: S603
                            "--cluster-replicas", str(replicas), "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
            cluster.wait_until_healthy()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def wait_until_healthy(self, timeout: float = 60) -> None:
        """Until every running node says cluster_state:ok (slots all covered, nodes all agreed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(node.cluster_state() == "ok" for node in self.nodes if node.process is not None):
                return
            time.sleep(0.2)
        raise RuntimeError(f"Redis Cluster not healthy after {timeout:.0f}s")


@dataclass
class RedisSentinels(LocalServers):
    """A Redis master with one replica, watched by three sentinels (quorum 2) that promote the
    replica a few seconds after the master dies: what `redis_sentinels` points the service at.

        with RedisSentinels.start(workdir) as group:
            print(group.sentinel_addresses, group.master_name)
    """

    master: RedisServer
    replica: RedisServer
    sentinels: list[LocalServer]
    sentinel_ports: list[int]
    master_name: str = "mymaster"

    @property
    def nodes(self) -> list[LocalServer]:  # type: ignore[override]
        return [*self.sentinels, self.master, self.replica]

    @property
    def sentinel_addresses(self) -> str:
        return ",".join(f"{LOOPBACK}:{port}" for port in self.sentinel_ports)

    @classmethod
    def start(cls, workdir: Path, *, detach: bool = False) -> RedisSentinels:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        master = RedisServer.start(Path(workdir) / "master", detach=detach)
        started: list[LocalServer] = [master]
        try:
            replica = RedisServer.start(Path(workdir) / "replica", detach=detach, replica_of=master.port)
            started.append(replica)
            group = cls(master, replica, [], [])
            for index in range(3):
                port = free_port()
                home = Path(workdir) / f"sentinel-{index}"
                home.mkdir(parents=True, exist_ok=True)
                # Sentinels rewrite their file with what they learn: each has its own.
                (home / "sentinel.conf").write_text("\n".join([
                    f"port {port}", f"bind {LOOPBACK}", f"dir {home}", f"logfile {home / 'sentinel.log'}",
                    f"sentinel monitor {group.master_name} {LOOPBACK} {master.port} 2",
                    f"sentinel down-after-milliseconds {group.master_name} 2000",
                    f"sentinel failover-timeout {group.master_name} 10000", ""]))
                sentinel = LocalServer()
                sentinel.process = subprocess.Popen(  # noqa: S603
                    [binary, str(home / "sentinel.conf"), "--sentinel"], stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT, start_new_session=detach)
                started.append(sentinel)
                group.sentinels.append(sentinel)
                group.sentinel_ports.append(port)
            group.wait_until_watched()
        except BaseException:
            for server in started:
                server.stop()
            raise
        return group

    def master_port(self) -> int | None:
        """The master's port as a sentinel that answers says, None if none does yet."""
        for port in self.sentinel_ports:
            reply = _ask(port, f"SENTINEL get-master-addr-by-name {self.master_name}")
            found = re.findall(rb"\r\n(\d+)\r\n", reply or b"")
            if found:
                return int(found[-1])
        return None

    def wait_until_watched(self, timeout: float = 60) -> None:
        """Until every sentinel knows the master and its replica, then until the replica is in sync."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            known = [_ask(port, f"SENTINEL replicas {self.master_name}") for port in self.sentinel_ports]
            if all(reply and str(self.replica.port).encode() in reply for reply in known):
                self.replica.wait_until_in_sync(max(1.0, deadline - time.monotonic()))
                return
            time.sleep(0.2)
        raise RuntimeError(f"the sentinels do not watch the master and its replica after {timeout:.0f}s")


def _ask(port: int, command: str) -> bytes | None:
    """One inline command's raw reply, None if the server does not answer."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
            sock.sendall(command.encode() + b"\r\n")
            # A short reply comes in one segment on loopback.
            return sock.recv(65536)
    except OSError:
        return None
