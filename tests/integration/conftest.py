"""Real servers for the integration tests: a KRaft Kafka broker and redis-server on loopback.

The fixtures use the same code as `stream-ndcg dev up` (stream_ndcg.devtools.servers).
Each test gets its own topic, consumer group and Redis namespace, so tests
share the servers without sharing state.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

import pytest
import redis
from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from prometheus_client.parser import text_string_to_metric_families

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.servers import KafkaBroker, RedisClusterNodes, RedisServer, free_port


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker.start(tmp_path_factory.mktemp("kafka"))
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer.start(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    cluster = RedisClusterNodes.start(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def create_topic(bootstrap: str, partitions: int = 1) -> str:
    """A new topic, returned once every partition has a leader (consumers then see all of them)."""
    name = f"events-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = admin.describe_topics([name])
            leaders = [p.get("leader_id", -1) for p in described[0].get("partitions", [])] if described else []
            if len(leaders) == partitions and all(leader >= 0 for leader in leaders):
                return name
            time.sleep(0.2)
    finally:
        admin.close()
    raise AssertionError(f"topic {name} has no leader for all {partitions} partitions after 30s")


def send(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    produce(bootstrap, topic, messages)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Service:
    """One `stream-ndcg run` process, configured through STREAM_NDCG_* variables."""

    env: dict[str, str]
    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        env = dict(os.environ, **self.env, STREAM_NDCG_METRICS_PORT=str(self.port))
        log = open(self.workdir / f"service-{self.port}-{self.starts}.log", "wb")  # noqa: SIM115
        self.starts += 1
        self.process = subprocess.Popen([sys.executable, "-m", "stream_ndcg.cli", "run"], env=env,
                                        stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"service exited with {self.process.returncode}: {self.logs()[-5000:]}")
            try:
                urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1).read()  # noqa: S310
                return
            except (URLError, OSError):
                time.sleep(0.1)
        raise AssertionError("service did not serve /healthz in 30s")

    def logs(self) -> str:
        """Everything every run of this service logged."""
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.workdir.glob(f"service-{self.port}-*.log")))

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        return int(self.process.returncode)

    def scrape(self) -> Samples:
        """The samples by name and labels; the `pipeline` label is checked against the service's
        key namespace and left out, so that services of different pipelines compare."""
        body = urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()  # noqa: S310
        pipeline = self.env.get("STREAM_NDCG_NAMESPACE") or self.env.get("STREAM_NDCG_GROUP_ID", "stream-ndcg")
        samples: Samples = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                labels = dict(sample.labels)
                assert labels.pop("pipeline", pipeline) == pipeline, sample
                samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
        return samples

    def ready(self) -> bool:
        try:
            return bool(urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status == 200)  # noqa: S310
        except (URLError, OSError):
            return False


def settled(samples: Samples) -> int:
    """Every message the service has taken in: accepted, duplicate or rejected."""
    return int(sum(v for (name, _), v in samples.items() if name in (
        "stream_ndcg_events_total", "stream_ndcg_events_rejected_total", "stream_ndcg_events_duplicate_total")))


def wait_for_messages(service: Service, expected: int, timeout: float = 180) -> Samples:
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        try:
            samples = service.scrape()
        except (URLError, OSError):
            time.sleep(0.5)
            continue
        seen = settled(samples)
        assert seen <= expected, f"more messages counted ({seen}) than sent ({expected}): double counting"
        if seen == expected:
            return samples
        time.sleep(0.3)
    raise AssertionError(f"{seen} of {expected} messages taken in after {timeout}s\n{service.logs()[-5000:]}")


@pytest.fixture
def service_env(kafka: KafkaBroker, redis_server: RedisServer) -> dict[str, str]:
    tag = uuid.uuid4().hex[:10]
    return {
        "STREAM_NDCG_BOOTSTRAP_SERVERS": kafka.bootstrap,
        "STREAM_NDCG_REDIS_URL": redis_server.url,
        "STREAM_NDCG_GROUP_ID": f"group-{tag}",
        "STREAM_NDCG_NAMESPACE": f"ns-{tag}",
        "STREAM_NDCG_CLOCK": "event",
        "STREAM_NDCG_LINGER": "50ms",
        "STREAM_NDCG_METRICS_HOST": "127.0.0.1",
    }


@pytest.fixture
def services(tmp_path: Path) -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        if service.process is not None and service.process.poll() is None:
            service.process.kill()
            service.process.wait()


def gauges_by_labels(samples: Samples, name: str, **match: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items()
            if n == name and all(dict(labels).get(k) == want for k, want in match.items())}


def expect_equal_to_replay(samples: Samples, summary: dict[str, Any], window: str, cutoffs: tuple[int, ...]) -> int:
    """Every quality gauge of one window against the replay's numbers, to 1e-9; returns how many were compared."""
    compared = 0
    for variant, by_k in summary["by_segment"].get("variant", {}).items():
        for k in cutoffs:
            expected = by_k[str(k)]
            labels = {"k": str(k), "window": window, "variant": variant}
            key = tuple(sorted(labels.items()))
            assert samples[("stream_ndcg_scored_impressions", key)] == expected["scored_impressions"]
            pairs = [("stream_ndcg_ndcg", expected["ndcg_mean"]), ("stream_ndcg_dcg", expected["dcg_mean"]),
                     ("stream_ndcg_judged_ratio", expected["judged_ratio"])]
            for name, value in pairs:
                got = samples[(name, key)]
                if value is None:
                    assert math.isnan(got), (name, key)
                else:
                    assert got == pytest.approx(value, abs=1e-9), (name, key, got, value)
                compared += 1
            impressions_key = tuple(sorted({"window": window, "variant": variant}.items()))
            assert samples[("stream_ndcg_impressions", impressions_key)] == expected["impressions"]
    return compared


def json_lines(messages: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [value for _, value in messages]


def to_json(obj: Any) -> bytes:
    return json.dumps(obj).encode()
