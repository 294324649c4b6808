"""A local Kafka for development and tests: a real broker on loopback, no Docker; and what every
local server shares (ports, readiness, stopping).

Kafka is a single-node KRaft broker run from the broker's jars on Maven
Central, fetched once with Maven into a cache outside the work tree
(``$STREAM_NDCG_CACHE``, default ``~/.cache/stream-ndcg``), listening on
127.0.0.1 only. Kafka's command-line tools (the console producer and the
transactional copier of the tests) are fetched the same way, beside the
broker's jars. Redis is `redis_servers`'.

    with KafkaBroker.start(workdir) as kafka:
        print(kafka.bootstrap)
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from stream_ndcg.devtools.ports import LOOPBACK, free_port

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
# Kafka ships its SLF4J binding only in the tarball (KAFKA-18466); without it the broker logs nothing.
LOG4J_VERSION = "2.24.3"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.stream-ndcg</groupId>
  <artifactId>kafka-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""

# The SLF4J binding of every classpath below, with log4j-core.
_LOGGING = [("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
            ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION)]

_LOG4J2 = """status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
"""


def cache_dir() -> Path:
    return Path(os.environ.get("STREAM_NDCG_CACHE", Path.home() / ".cache" / "stream-ndcg"))


def kafka_classpath() -> str:
    """The broker's classpath, fetched from Maven Central on first use."""
    return _maven_classpath("lib", [("org.apache.kafka", "kafka_2.13", KAFKA_VERSION), *_LOGGING])


def kafka_tools_classpath() -> str:
    """The classpath of Kafka's command-line tools (org.apache.kafka.tools.ConsoleProducer, ...),
    fetched from Maven Central on first use. It holds the Java client and its compression
    libraries, so the tools produce what the stack's Java producers produce."""
    return _maven_classpath("tools-lib", [("org.apache.kafka", "kafka-tools", KAFKA_VERSION), *_LOGGING])


def _maven_classpath(name: str, dependencies: list[tuple[str, str, str]]) -> str:
    """The jars of `dependencies` and all they need, copied once by Maven into the cache."""
    lib = cache_dir() / f"kafka-{KAFKA_VERSION}" / name
    if not lib.is_dir():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("Maven (mvn) is needed once to fetch the Kafka jars")
        lib.parent.mkdir(parents=True, exist_ok=True)
        pom = _POM.format(dependencies="\n".join(
            f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>" for group, artifact, version in dependencies))
        with tempfile.TemporaryDirectory(dir=lib.parent) as scratch:
            Path(scratch, "pom.xml").write_text(pom)
            logger.info("fetching Kafka %s jars from Maven Central into %s", KAFKA_VERSION, lib)
            subprocess.run(  # noqa: S603 - fixed arguments
                [mvn, "-B", "-q", "org.apache.maven.plugins:maven-dependency-plugin:3.7.1:copy-dependencies",
                 f"-DoutputDirectory={scratch}/lib"],
                cwd=scratch, check=True, stdout=subprocess.DEVNULL,
            )
            os.replace(Path(scratch, "lib"), lib)
    return str(lib / "*")


def wait_for_ready(check: str, ready: object, timeout: float, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{check} exited with {process.returncode}; see {log}")
        if callable(ready) and ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{check} not ready after {timeout:.0f}s; see {log}")


# How long a server is given to stop on SIGTERM before it is killed.
STOP_TIMEOUT_S = 20.0


def stop_process(process: subprocess.Popen[bytes] | None, pid: int | None = None,
                 timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL after `timeout`."""
    target = process.pid if process is not None else pid
    if target is None:
        return
    try:
        os.kill(target, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None:
            if process.poll() is not None:
                return
        elif not _alive(target):
            return
        time.sleep(0.1)
    try:
        os.kill(target, signal.SIGKILL)
    except ProcessLookupError:
        return
    if process is not None:
        process.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child still answers kill(0); its /proc status says it is dead.
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


class LocalServer:
    process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds."""
        stop_process(self.process, timeout=timeout)
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


class LocalServers:
    """Several local servers that start and stop together (`nodes`); a context manager."""

    nodes: Sequence[LocalServer]
    stop_timeout_s = STOP_TIMEOUT_S

    def stop(self) -> None:
        # All at once: a node stopped after the others may wait for peers that are gone.
        with ThreadPoolExecutor(max(1, len(self.nodes))) as pool:
            list(pool.map(lambda node: node.stop(self.stop_timeout_s), self.nodes))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


@dataclass
class KafkaBroker(LocalServer):
    """A KRaft node on loopback, broker and controller in one: alone, or one voter of a `KafkaCluster`."""

    workdir: Path
    port: int
    controller_port: int
    heap: str = "512m"
    process: subprocess.Popen[bytes] | None = None
    # user -> password: adds a SASL_PLAINTEXT listener taking SCRAM-SHA-256 and PLAIN for them.
    sasl_users: dict[str, str] | None = None
    sasl_port: int | None = None
    # In a cluster: this node's id, every voter (``id@host:port,...``), the replication factor of
    # new and internal topics (min.insync.replicas one less) and the id the nodes share.
    node_id: int = 1
    voters: str = ""
    replication: int = 1
    cluster_id: str = ""

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        if self.sasl_port is None:
            raise RuntimeError("this broker was started without sasl_users")
        return f"{LOOPBACK}:{self.sasl_port}"

    @classmethod
    def start(cls, workdir: Path, port: int | None = None, *, detach: bool = False,
              sasl_users: dict[str, str] | None = None) -> KafkaBroker:
        broker = cls(Path(workdir), port or free_port(), free_port(), sasl_users=sasl_users,
                     sasl_port=free_port() if sasl_users else None)
        broker.workdir.mkdir(parents=True, exist_ok=True)
        broker._configure()
        broker.launch(detach=detach)
        return broker

    def _configure(self) -> None:
        data = self.workdir / "data"
        listeners = f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}"
        advertised = f"PLAINTEXT://{LOOPBACK}:{self.port}"
        sasl: list[str] = []
        if self.sasl_users:
            listeners += f",SASL_PLAINTEXT://{LOOPBACK}:{self.sasl_port}"
            advertised += f",SASL_PLAINTEXT://{LOOPBACK}:{self.sasl_port}"
            plain_users = " ".join(f'user_{user}="{password}"' for user, password in self.sasl_users.items())
            sasl = [
                "sasl.enabled.mechanisms=SCRAM-SHA-256,PLAIN",
                "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config="
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
            ]
        in_sync = max(1, self.replication - 1)
        (self.workdir / "server.properties").write_text("\n".join([
            "process.roles=broker,controller",
            f"node.id={self.node_id}",
            f"controller.quorum.voters={self.voters or f'{self.node_id}@{LOOPBACK}:{self.controller_port}'}",
            f"listeners={listeners}",
            f"advertised.listeners={advertised}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            *sasl,
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={data}",
            "num.partitions=1",
            f"default.replication.factor={self.replication}",
            f"min.insync.replicas={in_sync}",
            f"offsets.topic.replication.factor={self.replication}",
            "offsets.topic.num.partitions=1",
            f"transaction.state.log.replication.factor={self.replication}",
            f"transaction.state.log.min.isr={in_sync}",
            "transaction.state.log.num.partitions=1",
            # A killed node is noticed, and its partitions led elsewhere, within seconds.
            "broker.session.timeout.ms=6000",
            "broker.heartbeat.interval.ms=1000",
            "group.initial.rebalance.delay.ms=0",
            "log.cleaner.dedupe.buffer.size=8388608",
            "auto.create.topics.enable=true",
            "",
        ]))
        (self.workdir / "log4j2.properties").write_text(_LOG4J2.format(log=self.workdir / "server.log"))
        if not (data / "meta.properties").exists():
            cluster_id = self.cluster_id or new_cluster_id()
            # SCRAM credentials of a KRaft cluster are written with the metadata at format time.
            scram = [arg for user, password in (self.sasl_users or {}).items()
                     for arg in ("--add-scram", f"SCRAM-SHA-256=[name={user},password={password}]")]
            subprocess.run(  # noqa: S603
                [_java(), "-cp", kafka_classpath(), "kafka.tools.StorageTool", "format", "-t", cluster_id,
                 "-c", str(self.workdir / "server.properties"), *scram],
                check=True, stdout=subprocess.DEVNULL,
            )

    def launch(self, *, detach: bool = False, wait: bool = True) -> None:
        """Start (or restart) the broker on its data directory and wait until it serves (a voter of a
        cluster serves once a quorum is up: start them all, then wait)."""
        with open(self.workdir / "stdout.log", "ab") as out:
            self.process = subprocess.Popen(  # noqa: S603
                [_java(), f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC",
                 f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                 "-cp", kafka_classpath(), "kafka.Kafka", str(self.workdir / "server.properties")],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=detach,
            )
        if wait:
            self.wait_until_ready()

    def wait_until_ready(self) -> None:
        if self.process is None:
            raise RuntimeError("the broker was not launched")
        wait_for_ready("Kafka", self._ready, 90, self.process, self.workdir / "server.log")

    def _ready(self) -> bool:
        log = self.workdir / "server.log"
        if not log.exists() or "Kafka Server started" not in log.read_text(errors="replace")[-200_000:]:
            return False
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=1):
                return True
        except OSError:
            return False

    def restart(self) -> None:
        self.stop()
        self.relaunch()

    def relaunch(self, *, wait: bool = True) -> None:
        """Start again after a stop or a kill, on the same data."""
        # The "started" line of the previous run must not count as readiness.
        log = self.workdir / "server.log"
        if log.exists():
            log.rename(self.workdir / f"server.{int(time.time() * 1000)}.log")
        self.launch(wait=wait)


@dataclass
class KafkaCluster(LocalServers):
    """KRaft nodes on loopback, each broker and controller (a voter), with every topic, the internal
    ones included, replicated to all of them and min.insync.replicas one less.

        with KafkaCluster.start(workdir, size=3) as kafka:
            print(kafka.bootstrap)
    """

    nodes: list[KafkaBroker]
    # A voter whose controlled shutdown waits for a quorum that is stopping with it: what the
    # whole cluster stopping loses is nothing.
    stop_timeout_s = 10.0

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @classmethod
    def start(cls, workdir: Path, size: int = 3, *, detach: bool = False) -> KafkaCluster:
        ports = [(free_port(), free_port()) for _ in range(size)]
        voters = ",".join(f"{i}@{LOOPBACK}:{controller}" for i, (_, controller) in enumerate(ports, start=1))
        cluster_id = new_cluster_id()
        nodes = [KafkaBroker(Path(workdir) / f"node-{i}", port, controller, heap="384m", node_id=i, voters=voters,
                             replication=size, cluster_id=cluster_id)
                 for i, (port, controller) in enumerate(ports, start=1)]
        try:
            for node in nodes:
                node.workdir.mkdir(parents=True, exist_ok=True)
                node._configure()
                node.launch(detach=detach, wait=False)
            for node in nodes:
                node.wait_until_ready()
        except BaseException:
            for node in nodes:
                node.stop()
            raise
        return cls(nodes)

    def node(self, node_id: int) -> KafkaBroker:
        return next(node for node in self.nodes if node.node_id == node_id)


def new_cluster_id() -> str:
    """16 random bytes, url-safe base64 without padding, not starting with '-' (as Kafka wants)."""
    while (cluster_id := base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")).startswith("-"):
        pass
    return cluster_id


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("Java 17+ is needed to run the Kafka broker")
    return java
