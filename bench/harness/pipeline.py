"""The service's batch pipeline in the bench's process, over a real redis-server, without Kafka:
a writer that feeds it messages, and the cost of each of its steps per event.

    settings = Settings.load(flags={"redis_url": url, "namespace": "api", "clock": "event"})
    Writer(settings).write_all(messages)
    cost_breakdown(url, workload(100_000, seed=1), "breakdown")    # {"engine": 60.5, ...} µs per event
"""

from __future__ import annotations

import gc
import json
import time
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple, cast

from bench.harness.workloads import BATCH, PARTITIONS
from stream_ndcg import wiring
from stream_ndcg.config import Settings
from stream_ndcg.engine import Engine
from stream_ndcg.events import parse_event
from stream_ndcg.pipeline import PartitionBatch
from stream_ndcg.service import build, collect_garbage_for_batches
from stream_ndcg.state.base import Commit
from stream_ndcg.state.redis import RedisStore

DEFAULT_GC_THRESHOLD = gc.get_threshold()


class Writer:
    """The service's batch pipeline, store and engine as `wiring` builds them from `settings`
    (their Redis URL and namespace included), fed messages without Kafka: partitioned by query
    over PARTITIONS partitions, their offsets counted. Runs on the event clock."""

    def __init__(self, settings: Settings) -> None:
        if settings.clock != "event":
            raise ValueError("the writer's messages carry their own time: give it settings with clock=event")
        self.store = wiring.redis_store(settings)
        self.pipeline = wiring.batch_pipeline(settings, self.store, wiring.engine(settings))
        self.epochs = {p: self.store.claim(f"events:{p}") for p in range(PARTITIONS)}
        self.offsets = dict.fromkeys(range(PARTITIONS), 0)

    def write(self, messages: list[bytes]) -> None:
        """One batch: each partition's part of the messages parsed, applied and committed."""
        by_partition: dict[int, list[bytes]] = {}
        for message in messages:
            query = json.loads(message)["query_id"]
            by_partition.setdefault(zlib.crc32(query.encode()) % PARTITIONS, []).append(message)
        for partition, part in by_partition.items():
            expected = self.offsets[partition] or None
            self.offsets[partition] += len(part)
            # The events as the parser makes them: the pipeline's checks of a Kafka record (its
            # key, its time ahead of the clock) and its segment projection are left out.
            self.pipeline.apply(f"events:{partition}", self.epochs[partition], [parse_event(m) for m in part],
                                self.offsets[partition], expected, None)

    def write_all(self, messages: list[bytes], batch: int = BATCH) -> None:
        """All the messages, `batch` at a time."""
        for start in range(0, len(messages), batch):
            self.write(messages[start:start + batch])


def events_per_cpu_second(redis_url: str, namespace: str, messages: list[bytes]) -> float:
    """Every message through the service's batch pipeline (event clock, pool ideal), in events per
    CPU-second of this process: what the squares and core benches compare, a process per run. The
    cyclic collector is tuned as the service tunes it (`collect_garbage_for_batches`), for the rest
    of the process: its cost grows with the objects a state keeps, which the default thresholds
    would charge a seventieth as often as the service does."""
    collect_garbage_for_batches()
    settings = Settings.load(environ={"STREAM_NDCG_REDIS_URL": redis_url, "STREAM_NDCG_NAMESPACE": namespace,
                                      "STREAM_NDCG_CLOCK": "event", "STREAM_NDCG_IDEAL": "pool"})
    writer = Writer(settings)
    started = time.process_time()
    writer.write_all(messages)
    return len(messages) / (time.process_time() - started)


class BenchRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


class _TimedEngine:
    """An engine whose `apply` is timed, everything else its own."""

    def __init__(self, engine: Engine, apply: Callable[..., Any]) -> None:
        self._engine, self.apply = engine, apply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


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
    # `stream-ndcg run`'s pipeline as it is built (its Kafka consumer is never opened): its store
    # reports each round trip to the exporter's histogram, as in the service.
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
    # The engine's class is a native one in the compiled core, whose methods cannot be replaced.
    pipeline.engine = cast(Engine, _TimedEngine(engine, timed("engine", engine.apply)))
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
    polls = _polls(messages, batch, live)
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


def _polls(messages: list[tuple[bytes, bytes]], batch: int, live: bool) -> list[list[list[BenchRecord]]]:
    """The messages as the service's polls would hand them out: each poll a list of one
    partition's records per partition it holds (see `cost_breakdown`)."""
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
    return polls
