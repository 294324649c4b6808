"""`stream-ndcg run` (or another of its services) in a process of its own, and what a bench reads of it: readiness, the
messages it has taken in, its memory and CPU time, a catch-up timed.

    service = ServiceProcess(kafka.bootstrap, redis_server.url, topic, "steady", clock="event")
    service.await_ready()
    ...
    service.stop()
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.request import urlopen

import redis
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.workloads import BATCH, PARTITIONS
from stream_ndcg.devtools.ports import free_port
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.vocabulary import MetricName


class ServiceProcess:
    """The service reading `topic` into `namespace`, with the benches' batch size; `command` is
    the service (`run`, `judge`, `ubi-bridge`), `settings` are more of its settings by name
    (clock="event"). Its log goes to a file of its own in the temporary directory, named after the
    namespace (`log`): two benches run at once use the same namespaces."""

    def __init__(self, bootstrap: str, redis_url: str, topic: str, namespace: str, *, command: str = "run",
                 **settings: str) -> None:
        self.port = free_port()
        self.redis_url, self.topic, self.namespace = redis_url, topic, namespace
        env = dict(os.environ, STREAM_NDCG_BOOTSTRAP_SERVERS=bootstrap, STREAM_NDCG_REDIS_URL=redis_url,
                   STREAM_NDCG_TOPICS=topic, STREAM_NDCG_GROUP_ID=f"svc-{namespace}",
                   STREAM_NDCG_NAMESPACE=namespace, STREAM_NDCG_METRICS_PORT=str(self.port),
                   STREAM_NDCG_API_PORT=str(free_port()),
                   STREAM_NDCG_BATCH_SIZE=str(BATCH), STREAM_NDCG_LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "INFO"),
                   **{f"STREAM_NDCG_{k.upper()}": v for k, v in settings.items()})
        descriptor, path = tempfile.mkstemp(prefix=f"stream-ndcg-bench-{namespace}-", suffix=".log")
        self.log = Path(path)
        with open(descriptor, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "stream_ndcg.cli", command], env=env,
                                            stdout=log, stderr=subprocess.STDOUT)
        self.peak_rss = 0

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def await_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status == 200:  # noqa: S310
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the service was not ready after {timeout:.0f} s")

    def gauge(self, name: str, timeout: float = 5) -> float | None:
        """A gauge of the service's /metrics without labels, or None if it has none of that name."""
        body = urlopen(self.metrics_url, timeout=timeout).read().decode()  # noqa: S310
        for family in text_string_to_metric_families(body):
            if family.name == name and family.samples:
                return float(family.samples[0].value)
        return None

    def histogram(self, name: str) -> tuple[float, float]:
        """The count and the sum of a histogram of the service's /metrics without labels (0, 0 if it
        has none of that name)."""
        body = urlopen(self.metrics_url, timeout=10).read().decode()  # noqa: S310
        found = {sample.name: float(sample.value) for family in text_string_to_metric_families(body)
                 if family.name == name for sample in family.samples}
        return found.get(f"{name}_count", 0.0), found.get(f"{name}_sum", 0.0)

    def committed(self) -> int:
        """`taken_in` of this service's topic."""
        client = redis.Redis.from_url(self.redis_url)
        try:
            return taken_in(client, self.namespace, self.topic)
        finally:
            client.close()

    def sample_rss(self) -> None:
        peak = process_memory(self.process.pid, "VmHWM")
        if peak is not None:
            self.peak_rss = peak

    def stop(self) -> None:
        self.sample_rss()
        self.process.terminate()
        self.process.wait(timeout=60)


def counted(client: redis.Redis, namespace: str) -> int:
    """Messages the service has taken in, as its store says."""
    store = RedisStore(client, namespace=namespace, bucket_ms=60_000, horizon_ms=60_000, state_ttl_ms=60_000)
    return sum(store.counts().values())


def taken_in(client: redis.Redis, namespace: str, topic: str) -> int:
    """Records of a topic of the benches (offset 0 on, no transactions) the service has committed,
    as its store's offsets say: read from Redis, whose answer does not wait on a busy service as
    its /metrics does."""
    store = RedisStore(client, namespace=namespace, bucket_ms=60_000, horizon_ms=60_000, state_ttl_ms=60_000)
    return sum(store.next_offset(f"{topic}:{n}") or 0 for n in range(PARTITIONS))


def process_memory(pid: int, field: str) -> int | None:
    """A memory figure of /proc/<pid>/status in bytes (VmRSS now, VmHWM the peak); None if the
    process has none (it has exited)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return None


def resident_bytes(pid: int | None = None) -> int:
    """A process's resident set now (VmRSS), this process's by default."""
    pid = os.getpid() if pid is None else pid
    resident = process_memory(pid, "VmRSS")
    if resident is None:
        raise RuntimeError(f"no VmRSS for process {pid}: it has exited")
    return resident


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_wait_seconds(pid: int) -> float:
    """How long a process's main thread has been runnable but waiting for a core so far (the
    run_delay of /proc/<pid>/schedstat): on a shared machine, the time others' work took from it."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


@dataclass(frozen=True)
class CatchUp:
    events_per_s: float
    # The first service's.
    peak_rss: int
    # Cores each kind of process kept busy meanwhile, on average ("service" sums the instances).
    cores: dict[str, float]
    # Process CPU time (user + system, every thread) the services used per million events taken
    # in, all instances together, and each instance's CPU seconds: the measure of scale-out that a
    # machine whose cores Kafka and Redis share can show, where wall time cannot.
    cpu_s_per_million: float
    cpu_s_by_instance: list[float]
    # Partitions each instance held when the catch-up ended (its assigned_partitions gauge), and
    # whether they were spread evenly when the figures began to be counted.
    partitions: list[int | None]
    spread_evenly: bool


def service_rate(bootstrap: str, redis_url: str, topic: str, total: int, namespace: str, instances: int = 1,
                 servers: Mapping[str, int | None] | None = None, **settings: str) -> CatchUp:
    """`instances` services of one group catching the topic up (on the event clock): their
    events/s, process CPU time per event and the cores they and the `servers` (name -> pid: Kafka,
    Redis) used, from the first message taken in with the partitions spread evenly over the
    instances to the `total`th; the peak RSS of the first."""
    client = redis.Redis.from_url(redis_url)
    services = [ServiceProcess(bootstrap, redis_url, topic, namespace, clock="event", **settings)
                for _ in range(instances)]
    pids = {name: pid for name, pid in (servers or {}).items() if pid is not None}

    def cpu() -> dict[str, float]:
        used = {name: cpu_seconds(pid) for name, pid in pids.items()}
        used.update({f"service{n}": cpu_seconds(service.process.pid) for n, service in enumerate(services)})
        return used

    # Counted from a moment the partitions are spread evenly: before that, one instance may hold
    # them all while the other is still starting, and its start-up and the rebalance would count
    # as the cost of an instance more. The moment of the first message taken in stands in, with
    # `spread_evenly` false, when the catch-up ends before that.
    first: tuple[float, int, dict[str, float]] | None = None
    even: tuple[float, int, dict[str, float]] | None = None
    try:
        while True:
            done = counted(client, namespace)
            now = time.perf_counter()
            if done and first is None:
                first = (now, done, cpu())
            if done and even is None and spread_evenly(held_partitions(services)):
                even = (now, done, cpu())
            if done >= total and first is not None:
                started, first_count, first_cpu = even or first
                spent = {name: seconds - first_cpu[name] for name, seconds in cpu().items()}
                by_instance = [spent.pop(f"service{n}") for n in range(instances)]
                cores = {name: round(seconds / (now - started), 2)
                         for name, seconds in {**spent, "service": sum(by_instance)}.items()}
                taken = done - first_count
                return CatchUp(taken / (now - started), services[0].peak_rss, cores,
                               round(1e6 * sum(by_instance) / taken, 2), [round(s, 2) for s in by_instance],
                               held_partitions(services, timeout=_LAST_SCRAPE_TIMEOUT), even is not None)
            services[0].sample_rss()
            time.sleep(0.05)
    finally:
        for service in services:
            service.stop()
        client.close()


# The first scrape after a catch-up brings the drill-down's query figures up to date over every row
# the catch-up wrote, which on a loaded machine takes longer than a scrape of a running service.
_LAST_SCRAPE_TIMEOUT = 120.0


def held_partitions(services: list[ServiceProcess], timeout: float = 5) -> list[int | None]:
    """The partitions each service holds (its assigned_partitions gauge); None for one whose
    /metrics does not answer (yet, or within `timeout` seconds)."""
    held: list[int | None] = []
    for service in services:
        try:
            gauge = service.gauge(MetricName.ASSIGNED_PARTITIONS, timeout)
        except OSError:
            gauge = None
        held.append(None if gauge is None else int(gauge))
    return held


def spread_evenly(held: list[int | None]) -> bool:
    """Every partition of the topic held, by instances holding as many as each other, give or take one."""
    counts = [n for n in held if n is not None]
    return len(counts) == len(held) and sum(counts) == PARTITIONS and max(counts) - min(counts) <= 1
