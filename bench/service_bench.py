"""The service against a real local Kafka and Redis, each figure next to a baseline of the same run.

    python -m bench.service_bench [--events 500000] [--quick]

1. throughput: `stream-ndcg run` catching up a topic from offset 0 to zero lag, next to a bare
   kafka-python consumer reading and JSON-decoding the same topic with the same settings; with
   and without the drill-down (alternated, best of two each); two instances of one group; the
   cores the services, Kafka and Redis kept busy meanwhile; the
   time per event of each step of the batch pipeline, run in this process over the same messages;
2. latency: judgment-to-metric p50/p99 (produce time to the change visible in /metrics) under a
   paced load of half the measured throughput;
3. flatness: time per judgment for a query with 10 impressions vs one with 100,000;
4. memory: Redis bytes per impression held, and the service's peak RSS with N/10 vs N impressions.

Prints one JSON line last and rewrites the service section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, cast
from urllib.request import urlopen

import redis
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewTopic
from prometheus_client.parser import text_string_to_metric_families

from bench.replay_bench import write_section
from stream_ndcg.config import Settings
from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.servers import KafkaBroker, free_port
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.engine import Engine
from stream_ndcg.events import parse_event
from stream_ndcg.metric import Measure
from stream_ndcg.pipeline import BatchPipeline, PartitionBatch
from stream_ndcg.service import build, collect_garbage_for_batches
from stream_ndcg.state.base import Commit
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.vocabulary import MetricName

BATCH = 500
PARTITIONS = 4
DEFAULT_GC_THRESHOLD = gc.get_threshold()
# The batch size the latency phase's load leaves the service (its batch_events histogram), and
# how many messages the cost of such batches is measured on.
SMALL_BATCH = 100
SMALL_BATCH_EVENTS = 100_000


def create_topic(bootstrap: str, name: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])
    admin.close()
    return name


def workload(events: int, seed: int, judged_share: float = 1 / 3, start_ms: int | None = None,
             rate: float = 2_000.0) -> list[tuple[bytes, bytes]]:
    """Zipf queries, 10-result lists, two variants, late judgments for about a third of the shown documents."""
    spec = SimulationSpec(events=events, seed=seed, queries=20_000, list_length=10, judged_share=judged_share,
                          rate=rate, max_delay_ms=1_800_000,
                          start_ms=start_ms if start_ms is not None else SimulationSpec.start_ms)
    return list(Simulator(spec).messages())


def bare_consumer_rate(bootstrap: str, topic: str, total: int) -> float:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"bare-{topic}", enable_auto_commit=False,
                             auto_offset_reset="earliest", max_poll_records=BATCH)
    seen, first = 0, 0.0
    try:
        while seen < total:
            for records in consumer.poll(timeout_ms=100, max_records=BATCH).values():
                if not first:
                    first = time.perf_counter()
                for record in records:
                    json.loads(record.value)
                seen += len(records)
        return (seen - 0) / (time.perf_counter() - first)
    finally:
        consumer.close()


class ServiceProcess:
    def __init__(self, bootstrap: str, redis_url: str, topic: str, namespace: str, **settings: str) -> None:
        self.port = free_port()
        env = dict(os.environ, STREAM_NDCG_BOOTSTRAP_SERVERS=bootstrap, STREAM_NDCG_REDIS_URL=redis_url,
                   STREAM_NDCG_TOPICS=topic, STREAM_NDCG_GROUP_ID=f"svc-{namespace}",
                   STREAM_NDCG_NAMESPACE=namespace, STREAM_NDCG_METRICS_PORT=str(self.port),
                   STREAM_NDCG_API_PORT=str(free_port()),
                   STREAM_NDCG_BATCH_SIZE=str(BATCH), STREAM_NDCG_LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "INFO"),
                   **{f"STREAM_NDCG_{k.upper()}": v for k, v in settings.items()})
        self.log = Path(tempfile.gettempdir()) / f"stream-ndcg-bench-{namespace}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "stream_ndcg.cli", "run"], env=env,
                                            stdout=log, stderr=subprocess.STDOUT)
        self.peak_rss = 0

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


def process_memory(pid: int, field: str) -> int | None:
    """A memory figure of /proc/<pid>/status in bytes (VmRSS now, VmHWM the peak); None if the
    process has none (it has exited)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return None


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CatchUp:
    events_per_s: float
    # The first service's.
    peak_rss: int
    # Cores each kind of process kept busy meanwhile, on average ("service" sums the instances).
    cores: dict[str, float]


def service_rate(bootstrap: str, redis_url: str, topic: str, total: int, namespace: str, instances: int = 1,
                 servers: Mapping[str, int | None] | None = None, **settings: str) -> CatchUp:
    """`instances` services of one group catching the topic up: their events/s, the peak RSS of
    the first, and the cores they and the `servers` (name -> pid: Kafka, Redis) used meanwhile."""
    client = redis.Redis.from_url(redis_url)
    services = [ServiceProcess(bootstrap, redis_url, topic, namespace, clock="event", **settings)
                for _ in range(instances)]
    pids = {name: pid for name, pid in (servers or {}).items() if pid is not None}

    def cpu() -> dict[str, float]:
        used = {name: cpu_seconds(pid) for name, pid in pids.items()}
        used["service"] = sum(cpu_seconds(service.process.pid) for service in services)
        return used

    first_at, first_count, first_cpu = 0.0, 0, {}
    try:
        while True:
            done = counted(client, namespace)
            now = time.perf_counter()
            if done and not first_at:
                first_at, first_count, first_cpu = now, done, cpu()
            if done >= total:
                cores = {name: round((seconds - first_cpu[name]) / (now - first_at), 2)
                         for name, seconds in cpu().items()}
                return CatchUp((done - first_count) / (now - first_at), services[0].peak_rss, cores)
            services[0].sample_rss()
            time.sleep(0.05)
    finally:
        for service in services:
            service.stop()
        client.close()


class BenchRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


def cost_breakdown(redis_url: str, messages: list[tuple[bytes, bytes]], namespace: str,
                   batch: int = BATCH, *, live: bool = False) -> dict[str, float]:
    """Microseconds per event of each step of the service's batch pipeline, run in this process
    over the same messages (keyed over PARTITIONS partitions) with the service's own wiring and
    settings: parse (the contract's checks), load (decoding), engine, commit (building the
    payload, then the rest), each with its Redis round trips apart. The batches are a catch-up's,
    `batch` records of one partition each, or with `live` the messages `batch` at a time as they
    arrive, spread over the partitions."""
    settings = Settings.load(environ={"STREAM_NDCG_REDIS_URL": redis_url, "STREAM_NDCG_NAMESPACE": namespace,
                                      "STREAM_NDCG_CLOCK": "event", "STREAM_NDCG_BATCH_SIZE": str(BATCH)})
    spent = dict.fromkeys(("parse", "parse_redis", "load", "load_redis", "engine", "payload", "commit",
                           "commit_redis"), 0.0)
    round_trips = [0.0]
    # `stream-ndcg run`'s pipeline as it is built (its Kafka consumer is never opened).
    pipeline = build(settings)[0].pipeline
    store, engine = cast(RedisStore, pipeline.store), pipeline.engine
    observe = store._observe

    def observe_round_trip(seconds: float) -> None:
        round_trips[0] += seconds
        observe(seconds)

    store._observe = observe_round_trip

    def timed(step: str, function: Callable[..., Any], redis_step: str | None = None) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started, redis_before, payload_before = time.perf_counter(), round_trips[0], spent["payload"]
            try:
                return function(*args, **kwargs)
            finally:
                redis_spent = round_trips[0] - redis_before
                spent[step] += time.perf_counter() - started - redis_spent - (spent["payload"] - payload_before)
                if redis_step:
                    spent[redis_step] += redis_spent
        return call

    # A new segment value is admitted in Redis while its record is parsed.
    pipeline.parse = timed("parse", pipeline.parse, "parse_redis")  # type: ignore[method-assign]
    store.load = timed("load", store.load, "load_redis")  # type: ignore[method-assign]
    engine.apply = timed("engine", engine.apply)  # type: ignore[method-assign]
    store.commit = timed("commit", store.commit, "commit_redis")  # type: ignore[method-assign]
    build_payload = store._payload

    def payload(commit: Commit) -> Any:
        started = time.perf_counter()
        try:
            return build_payload(commit)
        finally:
            spent["payload"] += time.perf_counter() - started

    store._payload = payload  # type: ignore[method-assign]
    partitions = [f"bench:{p}" for p in range(PARTITIONS)]
    epochs = {name: store.claim(name) for name in partitions}
    arrived: list[BenchRecord] = []
    offsets = [0] * PARTITIONS
    for key, value in messages:
        partition = zlib.crc32(key) % PARTITIONS
        arrived.append(BenchRecord("bench", partition, offsets[partition], key, value))
        offsets[partition] += 1
    polls: list[list[list[BenchRecord]]] = []
    if live:
        # Records as they arrive: `batch` at a time, from whichever partitions they went to.
        for first in range(0, len(arrived), batch):
            by_partition: dict[int, list[BenchRecord]] = {}
            for record in arrived[first:first + batch]:
                by_partition.setdefault(record.partition, []).append(record)
            polls.append(list(by_partition.values()))
    else:
        # A catch-up: kafka-python hands out one partition's fetched records at a time.
        partitioned = [[record for record in arrived if record.partition == p] for p in range(PARTITIONS)]
        for first in range(0, max(offsets), batch):
            polls += [[records[first:first + batch]] for records in partitioned if records[first:first + batch]]
    stored: list[int | None] = [None] * PARTITIONS
    collect_garbage_for_batches()
    started = time.perf_counter()
    try:
        for poll in polls:
            pipeline.run([PartitionBatch(partitions[part[0].partition], epochs[partitions[part[0].partition]], part,
                                         stored[part[0].partition]) for part in poll], int(time.time() * 1000))
            for part in poll:
                stored[part[0].partition] = part[-1].offset + 1
        total = time.perf_counter() - started
    finally:
        gc.unfreeze()
        gc.set_threshold(*DEFAULT_GC_THRESHOLD)
    per_event = {step: round(1e6 * seconds / len(messages), 1) for step, seconds in spent.items()}
    per_event["other"] = round(1e6 * (total - sum(spent.values())) / len(messages), 1)
    per_event["in_process"] = round(1e6 * total / len(messages), 1)
    return per_event


def memory_by_kind(client: redis.Redis, namespace: str) -> dict[str, int]:
    """MEMORY USAGE of a namespace's keys, summed by kind (the key's name after the hash tag)."""
    kinds: dict[str, int] = {}
    keys = list(client.scan_iter(match=f"{{{namespace}:*", count=1000))
    for first in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[first:first + 1000]:
            pipe.memory_usage(key, samples=0)
        for key, used in zip(keys[first:first + 1000], pipe.execute(), strict=True):
            kind = key.decode().split("}:", 1)[1].split(":", 1)[0]
            kinds[kind] = kinds.get(kind, 0) + int(used or 0)
    return kinds


def latency(bootstrap: str, redis_url: str, rate: float, probes: int) -> dict[str, Any]:
    topic = create_topic(bootstrap, "latency")
    service = ServiceProcess(bootstrap, redis_url, topic, "latency", clock="wall", linger="20ms")
    service.await_ready()
    stop = threading.Event()
    now_ms = int(time.time() * 1000)

    def background() -> None:
        spec = SimulationSpec(events=10**9, seed=5, queries=20_000, rate=rate, start_ms=now_ms,
                              max_delay_ms=60_000)
        messages = Simulator(spec).messages()
        # takewhile, not a filter: the simulated stream is endless, and a filter would go on
        # drawing from it, holding the GIL, for the rest of the bench.
        produce(bootstrap, topic, itertools.takewhile(lambda _: not stop.is_set(), messages), paced=True, rate=rate)

    load = threading.Thread(target=background, daemon=True)
    load.start()
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1)

    def send(event: dict[str, Any]) -> None:
        producer.send(topic, key=b"probe", value=json.dumps(event).encode())
        producer.flush()

    wanted = {"k": "5", "variant": "probe", "window": "5m"}

    def probe_value() -> float | None:
        body = urlopen(f"http://127.0.0.1:{service.port}/metrics", timeout=5).read().decode()  # noqa: S310
        for family in text_string_to_metric_families(body):
            if family.name == MetricName.DCG_NUMERATOR:
                for sample in family.samples:
                    if wanted.items() <= sample.labels.items():
                        return float(sample.value)
        return None

    try:
        ts = int(time.time() * 1000)
        send({"type": "impression", "impression_id": "probe-1", "query_id": "probe", "ts": ts,
              "results": ["p1", "p2", "p3"], "segment": {"variant": "probe"}})
        deadline = time.monotonic() + 120
        while True:
            try:
                if probe_value() is not None:
                    break
            except OSError:
                pass  # the service is still starting
            if time.monotonic() > deadline:
                body = urlopen(f"http://127.0.0.1:{service.port}/metrics", timeout=5).read().decode()  # noqa: S310
                lag = [line for line in body.splitlines() if line.startswith(MetricName.CONSUMER_LAG)]
                raise RuntimeError(f"the probe impression never showed up in /metrics; lag: {lag}; "
                                   f"service log: {service.log}")
            time.sleep(0.05)
        delays = []
        for i in range(probes):
            before = probe_value()
            grade = 1 + i % 3
            started = time.perf_counter()
            send({"type": "judgment", "query_id": "probe", "doc_id": "p2", "grade": grade,
                  "ts": int(time.time() * 1000), "event_id": f"probe-{i:06d}"})
            while probe_value() == before:
                if time.perf_counter() - started > 30:
                    # The service did not keep up with the load: say so in the results.
                    return {"error": f"probe {i} not visible after 30 s: the service fell behind the load",
                            "probes": i, "load_events_per_s": round(rate)}
                time.sleep(0.002)
            delays.append(time.perf_counter() - started)
            time.sleep(0.05)
        delays.sort()
        return {"p50_ms": round(1000 * delays[len(delays) // 2], 1),
                "p99_ms": round(1000 * delays[min(len(delays) - 1, math.ceil(0.99 * len(delays)) - 1)], 1),
                "probes": probes, "load_events_per_s": round(rate)}
    finally:
        stop.set()
        producer.close()
        service.stop()


def flatness(redis_url: str, big: int, judgments: int) -> dict[str, float]:
    """Time per judgment (load, apply, commit in Redis) for a 10-impression and a `big`-impression query."""
    client = redis.Redis.from_url(redis_url)
    measure = Measure(cutoffs=(5, 10))
    bucket = 60_000
    engine = Engine(measure, bucket, horizon_ms=3_600_000)
    store = RedisStore(client, namespace="flat", bucket_ms=bucket, horizon_ms=3_600_000, state_ttl_ms=86_400_000,
                       wall_clock=False)
    pipeline = BatchPipeline(store, engine, event_clock=True)
    epoch = store.claim("flat:0")
    offset: list[int | None] = [None]
    t0 = 1_763_683_200_000

    def run(messages: list[bytes]) -> float:
        events = [parse_event(m) for m in messages]
        started = time.perf_counter()
        next_offset = (offset[0] or 0) + len(messages)
        pipeline.apply("flat:0", epoch, events, next_offset, offset[0])
        offset[0] = next_offset
        return time.perf_counter() - started

    import random

    rnd = random.Random(3)  # noqa: S311
    for query, count in (("small", 10), ("big", big)):
        batch: list[bytes] = []
        for i in range(count):
            docs = sorted(range(30), key=lambda d: d + rnd.gauss(0, 3))[:10]
            batch.append(json.dumps({"type": "impression", "impression_id": f"{query}-{i}", "query_id": query,
                                     "ts": t0 + (i * 300_000) // count, "results": [f"d{d}" for d in docs],
                                     "segment": {"variant": "AB"[i % 2]}}).encode())
            if len(batch) == 1000:
                run(batch)
                batch = []
        if batch:
            run(batch)
    times: dict[str, list[float]] = {"small": [], "big": []}
    for i in range(judgments):
        for query in ("small", "big"):
            event = {"type": "judgment", "query_id": query, "doc_id": f"d{i % 30}", "grade": i % 4,
                     "ts": t0 + 300_000 + i, "event_id": f"j{i:06d}"}
            times[query].append(run([json.dumps(event).encode()]))
    client.close()
    small, large = statistics.median(times["small"]), statistics.median(times["big"])
    return {"small_ms": round(1000 * small, 3), "big_ms": round(1000 * large, 3), "ratio": round(large / small, 2),
            "big_impressions": big, "judgments": judgments}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--memory-impressions", type=int, default=1_000_000)
    parser.add_argument("--flat-impressions", type=int, default=100_000)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="small sizes, to check that the bench runs")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    args = parser.parse_args()
    if args.quick:
        args.events, args.memory_impressions, args.flat_impressions, args.probes = 20_000, 20_000, 5_000, 20
    result: dict[str, Any] = {"bench": "service"}
    with tempfile.TemporaryDirectory(prefix="stream-ndcg-bench-") as root, \
            KafkaBroker.start(Path(root, "kafka")) as kafka, RedisServer.start(Path(root, "redis")) as server:
        client = redis.Redis.from_url(server.url)
        topic = create_topic(kafka.bootstrap, "throughput")
        messages = workload(args.events, seed=1)
        produce(kafka.bootstrap, topic, messages)
        bare = bare_consumer_rate(kafka.bootstrap, topic, len(messages))
        # With and without the drill-down alternated, best of two each: one run apiece swung by
        # 5-10% on this shared machine, as much as the difference measured.
        without_rows: list[float] = []
        servers = {"kafka": kafka.pid, "redis": server.pid}
        one: list[CatchUp] = []
        for round_ in range(2):
            one.append(service_rate(kafka.bootstrap, server.url, topic, len(messages), f"throughput{round_}",
                                    servers=servers))
            without_rows.append(service_rate(kafka.bootstrap, server.url, topic, len(messages),
                                             f"no-drilldown{round_}", drilldown="false").events_per_s)
        fastest = max(one, key=lambda run: run.events_per_s)
        service, without = fastest.events_per_s, max(without_rows)
        two = service_rate(kafka.bootstrap, server.url, topic, len(messages), "two", instances=2, servers=servers)
        pair = two.events_per_s
        result["throughput"] = {"events": len(messages), "service_events_per_s": round(service),
                                "bare_kafka_python_events_per_s": round(bare), "ratio": round(service / bare, 3),
                                "without_drilldown_events_per_s": round(without),
                                "drilldown_ratio": round(service / without, 3),
                                "two_instances_events_per_s": round(pair), "scale_ratio": round(pair / service, 3),
                                "cores_one_instance": fastest.cores, "cores_two_instances": two.cores}
        print(json.dumps(result["throughput"]), file=sys.stderr)
        breakdown = cost_breakdown(server.url, messages, "breakdown")
        decode_started = time.perf_counter()
        for _, value in messages:
            json.loads(value)
        decode_us = 1e6 * (time.perf_counter() - decode_started) / len(messages)
        breakdown["kafka_fetch"] = round(1e6 / bare - decode_us, 1)
        breakdown["service"] = round(1e6 / service, 1)
        result["cost_us_per_event"] = breakdown
        # The latency phase's load leaves the service batches of about a hundred records: what a
        # batch costs per event at that size, next to the catch-up's, on the same messages.
        head = messages[:SMALL_BATCH_EVENTS]
        result["batch_size_cost_us_per_event"] = {
            str(size): cost_breakdown(server.url, head, f"batch{size}", batch=size, live=True)["in_process"]
            for size in (BATCH, SMALL_BATCH)}
        print(json.dumps(breakdown), json.dumps(result["batch_size_cost_us_per_event"]), file=sys.stderr)

        # On servers of its own: after the throughput run the shared broker and Redis carry
        # half a million events of state, and probes there have been lost in the noise.
        with KafkaBroker.start(Path(root, "kafka-latency")) as quiet_kafka, \
                RedisServer.start(Path(root, "redis-latency")) as quiet_redis:
            result["latency"] = latency(quiet_kafka.bootstrap, quiet_redis.url, service / 2, args.probes)
        print(json.dumps(result["latency"]), file=sys.stderr)

        result["flatness"] = flatness(server.url, args.flat_impressions, 300 if not args.quick else 50)
        print(json.dumps(result["flatness"]), file=sys.stderr)

        memory: dict[str, Any] = {}
        for held in (args.memory_impressions // 10, args.memory_impressions):
            client.flushall()
            baseline = int(client.info("memory")["used_memory"])
            topic = create_topic(kafka.bootstrap, f"memory-{held}")
            # Few judgments: the figure is about what impressions cost.
            stream = [m for m in workload(int(held * 1.2), seed=7, judged_share=0.03)]
            impressions = sum(1 for _, v in stream if b'"impression"' in v)
            produce(kafka.bootstrap, topic, stream)
            rss = service_rate(kafka.bootstrap, server.url, topic, len(stream), f"memory{held}").peak_rss
            used = int(client.info("memory")["used_memory"]) - baseline
            kinds = memory_by_kind(client, f"memory{held}")
            memory[str(held)] = {"impressions": impressions, "redis_bytes_per_impression": round(used / impressions),
                                 "service_peak_rss_mib": round(rss / 2**20, 1),
                                 "bytes_per_impression_by_kind": {kind: round(n / impressions, 1)
                                                                  for kind, n in sorted(kinds.items())}}
            print(json.dumps(memory[str(held)]), file=sys.stderr)
        small, large = memory[str(args.memory_impressions // 10)], memory[str(args.memory_impressions)]
        memory["rss_ratio"] = round(large["service_peak_rss_mib"] / small["service_peak_rss_mib"], 3)
        result["memory"] = memory
        client.close()

    write_section(args.results, "## Service", section(result, " ".join(sys.argv[1:])))
    print(json.dumps(result))
    return 0


def section(result: dict[str, Any], flags: str) -> str:
    tp, lat, flat, mem = result["throughput"], result["latency"], result["flatness"], result["memory"]
    cost, by_size = result["cost_us_per_event"], result["batch_size_cost_us_per_event"]
    held = [k for k in mem if k != "rss_ratio"]
    latency_row = (f"| judgment-to-metric latency at {lat['load_events_per_s']} events/s | "
                   + (f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms ({lat['probes']} probes) | | | p99 < 150 ms |"
                      if "error" not in lat else f"not measured: {lat['error']} | | | p99 < 150 ms |"))
    rows = [
        "## Service",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M UTC}; machine: {platform.machine()}, {os.cpu_count()} cores "
        f"(shared, noisy), CPython {platform.python_version()}, Kafka 4.1.1 (KRaft, one node), redis-server "
        f"{redis_version()}, all on loopback",
        f"- command: `{('python -m bench.service_bench ' + flags).strip()}` (via `make bench`)",
        "",
        "| figure | measured | baseline (same run) | ratio | target |",
        "|---|---:|---:|---:|---|",
        f"| throughput, {tp['events']} events from offset 0 | {tp['service_events_per_s']} events/s | "
        f"{tp['bare_kafka_python_events_per_s']} events/s (bare kafka-python + json.loads) | {tp['ratio']} | >= 0.5 |",
        f"| throughput with the drill-down's upkeep (best of 2, alternated) | {tp['service_events_per_s']} events/s | "
        f"{tp['without_drilldown_events_per_s']} events/s (drilldown=false) | {tp['drilldown_ratio']} | >= 0.9 |",
        f"| two instances of one group | {tp['two_instances_events_per_s']} events/s | "
        f"{tp['service_events_per_s']} events/s (one) | {tp['scale_ratio']} | >= 1.7 |",
        latency_row,
        f"| time per judgment, 10 vs {flat['big_impressions']} impressions | {flat['big_ms']} ms | "
        f"{flat['small_ms']} ms | {flat['ratio']} | < 1.5 |",
    ]
    for key in held:
        rows.append(f"| memory, {mem[key]['impressions']} impressions held | {mem[key]['redis_bytes_per_impression']}"
                    f" Redis bytes/impression; service peak RSS {mem[key]['service_peak_rss_mib']} MiB | | | "
                    "<= 150 bytes |")
    rows += [f"| service RSS, {held[1]} vs {held[0]} impressions | | | {mem['rss_ratio']} | within 1.2 |", ""]
    rows += [f"Time per event, in microseconds, next to the throughput: the service {cost['service']} in all "
             f"(one over its rate). Kafka's part: {cost['kafka_fetch']} to fetch (the bare consumer's time less its "
             f"json.loads). The batch pipeline run in the bench's process over the same messages in a catch-up's "
             f"batches ({BATCH} records of one partition), with the service's settings: {cost['in_process']} in "
             f"all, of which parse {cost['parse']} + Redis "
             f"{cost['parse_redis']}, load {cost['load']} "
             f"+ Redis {cost['load_redis']}, engine {cost['engine']}, commit payload {cost['payload']}, commit "
             f"{cost['commit']} + Redis {cost['commit_redis']}, the rest {cost['other']}. The same pipeline over the "
             f"first {SMALL_BATCH_EVENTS} messages taken as they arrive, over all partitions, {SMALL_BATCH} at a "
             f"time (what the latency phase's load leaves the service) costs {by_size[str(SMALL_BATCH)]} per event, "
             f"against {by_size[str(BATCH)]} {BATCH} at a time.", ""]
    rows += [f"Cores busy while catching up (2 on this machine), one instance: {cores(tp['cores_one_instance'])}; two "
             f"instances of one group: {cores(tp['cores_two_instances'])}.", ""]
    kinds = mem[held[1]]["bytes_per_impression_by_kind"]
    rows += ["Redis bytes per impression by key kind (MEMORY USAGE, the larger run): "
             + ", ".join(f"{kind} {value}" for kind, value in kinds.items())
             + " (`rows` and `rowlog` are the drill-down's).", ""]
    return "\n".join(rows)


def cores(used: Mapping[str, float]) -> str:
    parts = ", ".join(f"{name} {value}" for name, value in sorted(used.items()))
    return f"{parts} ({round(sum(used.values()), 2)} in all)"


def redis_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
    return next((part.split("=")[1] for part in out.split() if part.startswith("v=")), "?")


if __name__ == "__main__":
    sys.exit(main())
