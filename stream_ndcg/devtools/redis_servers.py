"""A local Redis for development and tests: Debian's ``redis-server`` on loopback, one server or a
cluster, with AOF ``everysec`` as production should run it.

    with RedisServer.start(workdir) as redis:
        print(redis.url)
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from stream_ndcg.devtools.servers import LOOPBACK, LocalServer, LocalServers, free_port, wait_for_ready


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

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{LOOPBACK}:{self.port}/0"

    @classmethod
    def start(cls, workdir: Path, port: int | None = None, *, detach: bool = False,
              tls: TlsFiles | None = None, cluster: bool = False) -> RedisServer:
        server = cls(Path(workdir), port or free_port(), tls=tls, cluster=cluster)
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
