"""One `stream-ndcg run` (or `judge`) process for a test: its environment, start, scrapes, kill -9 and teardown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

from prometheus_client.parser import text_string_to_metric_families

from stream_ndcg.devtools.ports import free_port
from stream_ndcg.vocabulary import MetricName
from tests.support.wait import wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def service_environment(bootstrap: str, redis_url: str, **settings: str) -> dict[str, str]:
    """STREAM_NDCG_* variables for a service of its own consumer group and Redis namespace, with
    the event clock (so that the numbers do not depend on when the test runs); `settings` add to
    them or replace them."""
    tag = uuid.uuid4().hex[:10]
    return {
        "STREAM_NDCG_BOOTSTRAP_SERVERS": bootstrap,
        "STREAM_NDCG_REDIS_URL": redis_url,
        "STREAM_NDCG_GROUP_ID": f"group-{tag}",
        "STREAM_NDCG_NAMESPACE": f"ns-{tag}",
        "STREAM_NDCG_CLOCK": "event",
        "STREAM_NDCG_LINGER": "50ms",
        "STREAM_NDCG_METRICS_HOST": "127.0.0.1",
        # `wait_for_messages` waits for figures over queries computed after the last message: a
        # short interval keeps that wait short.
        "STREAM_NDCG_QUERY_FIGURES_INTERVAL": "1s",
        **settings,
    }


@dataclass
class Service:
    """One `stream-ndcg run` process, configured through STREAM_NDCG_* variables."""

    env: dict[str, str]
    workdir: Path
    port: int = field(default_factory=free_port)
    # The drill-down API's listener.
    api_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    # The interpreter that runs it, with its flags: by default the one running the tests.
    python: tuple[str, ...] = (sys.executable,)
    # The `stream-ndcg` command it runs: run, or judge.
    command: str = "run"

    def start(self) -> None:
        env = dict(os.environ, STREAM_NDCG_API_PORT=str(self.api_port), **self.env,
                   STREAM_NDCG_METRICS_PORT=str(self.port))
        log = open(self.workdir / f"service-{self.port}-{self.starts}.log", "wb")  # noqa: SIM115
        self.starts += 1
        self.process = subprocess.Popen([*self.python, "-m", "stream_ndcg.cli", self.command], env=env,
                                        stdout=log, stderr=subprocess.STDOUT)
        log.close()
        process = self.process

        def serving() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"service exited with {process.returncode}: {self.logs()[-5000:]}")
            try:
                urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1).read()  # noqa: S310
                return True
            except OSError:
                return False

        wait_until(serving, 30, lambda: f"the service serving /healthz\n{self.logs()[-5000:]}", interval=0.1)

    def logs(self) -> str:
        """Everything every run of this service logged."""
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.workdir.glob(f"service-{self.port}-*.log")))

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """kill -9, as a crash would end it."""
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
                self.kill()
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

    def env_for_tools(self) -> dict[str, str]:
        """The environment of a `stream-ndcg` command run against this service's Kafka and Redis."""
        return dict(os.environ, **self.env)

    def headers(self, path: str, token: str = "") -> dict[str, str]:
        """The response headers of an API path, whatever its status."""
        request = Request(f"http://127.0.0.1:{self.api_port}{path}",
                          headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urlopen(request, timeout=30) as response:  # noqa: S310
                return dict(response.headers)
        except HTTPError as exc:
            return dict(exc.headers)

    def api(self, path: str, token: str = "") -> tuple[int, Any]:
        """GET an API path: the status and the decoded JSON body (the text, if it is not JSON)."""
        request = Request(f"http://127.0.0.1:{self.api_port}{path}",
                          headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urlopen(request, timeout=30) as response:  # noqa: S310
                status, body = response.status, response.read()
        except HTTPError as exc:
            status, body = exc.code, exc.read()
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body.decode()

    def becomes_ready(self, timeout: float = 30) -> bool:
        """Whether /readyz says ready within `timeout`: a rebalance (a member joining or leaving, or
        the stall watchdog's rejoin on a loaded machine) makes it say no for a few seconds."""
        try:
            return wait_until(self.ready, timeout, "/readyz saying ready")
        except AssertionError:
            return False

    def ready(self) -> bool:
        try:
            return bool(urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status == 200)  # noqa: S310
        except OSError:
            return False


@contextmanager
def killed_at_exit(services: Iterable[Service]) -> Iterator[None]:
    """kill -9 every service of `services` (read at exit, so it may grow) still running when the block ends,
    however it ends: a failed test leaves no process behind."""
    try:
        yield
    finally:
        for service in services:
            if service.running():
                service.kill()


def settled(samples: Samples) -> int:
    """Every message the service has taken in: accepted, duplicate, rejected, or a judgment of a source
    it does not list."""
    return int(sum(v for (name, _), v in samples.items() if name in (
        "stream_ndcg_events_total", "stream_ndcg_events_rejected_total", "stream_ndcg_events_duplicate_total",
        "stream_ndcg_judgments_unlisted_source_total")))


def progress(service: Service) -> int:
    """The messages the service has taken in, 0 while it does not answer (starting, killed)."""
    try:
        return settled(service.scrape())
    except OSError:
        return 0


def wait_for_messages(service: Service, expected: int, timeout: float = 180) -> Samples:
    """The service's samples once it has taken in exactly `expected` messages, and, where it exports
    figures over queries (the drill-down's, brought up to date every query_figures_interval), once
    they come from a computation begun after that; fails on more messages (double counting)."""
    taken = _wait_for_messages_taken(service, expected, timeout)
    if (MetricName.QUERY_FIGURES_TIMESTAMP, ()) not in taken:
        return taken
    samples = wait_for_query_figures(service, timeout)
    assert settled(samples) == expected, f"{settled(samples)} messages counted after {expected}: double counting"
    return samples


def _wait_for_messages_taken(service: Service, expected: int, timeout: float) -> Samples:
    seen = -1

    def taken_in() -> Samples | None:
        nonlocal seen
        try:
            samples = service.scrape()
        except OSError:
            return None
        seen = settled(samples)
        assert seen <= expected, f"more messages counted ({seen}) than sent ({expected}): double counting"
        return samples if seen == expected else None

    return wait_until(taken_in, timeout, lambda: f"{seen} of {expected} messages taken in\n{service.logs()[-5000:]}",
                      interval=0.3)


def wait_for_query_figures(service: Service, timeout: float = 60) -> Samples:
    """The service's samples once its figures over queries (brought up to date every
    query_figures_interval) come from a computation begun after this call: with every row committed
    before it."""
    since = time.time()

    def computed_since() -> Samples | None:
        samples = service.scrape()
        return samples if samples.get((MetricName.QUERY_FIGURES_TIMESTAMP, ()), 0.0) > since else None

    return wait_until(computed_since, timeout, lambda: f"no figures over queries computed since {since}\n"
                      f"{service.logs()[-5000:]}", interval=0.3, ignoring=(OSError,))


def own_sample(service: Service, name: str) -> float:
    """One of the process's own samples (not the shared state's), 0 while it has none or does not answer."""
    try:
        return service.scrape().get((name, ()), 0.0)
    except OSError:
        return 0.0


def assigned_partitions(service: Service) -> int:
    """The input partitions the instance holds (has claimed)."""
    return int(own_sample(service, "stream_ndcg_assigned_partitions"))


def records_committed(service: Service) -> int:
    """The records the instance itself has committed (the sizes of its batches, summed): the event
    counters are the shared state's, every instance reports them all."""
    return int(own_sample(service, "stream_ndcg_batch_events_sum"))


def wait_for_progress(service: Service, at_least: int, timeout: float = 120) -> int:
    """The messages the service has taken in, once they are `at_least` (a point of the stream, not a time)."""
    return wait_until(lambda: (n := progress(service)) >= at_least and n, timeout,
                      lambda: f"{at_least} messages taken in\n{service.logs()[-3000:]}")


def wait_for_partitions(service: Service, timeout: float = 60) -> int:
    """The partitions the instance holds, once it holds any: it has joined the group and claimed them."""
    return wait_until(lambda: assigned_partitions(service), timeout,
                      lambda: f"partitions held by the instance on port {service.port}\n{service.logs()[-3000:]}")
