"""The benches' workload: the simulator's Zipf traffic, the topic it goes to, and the bare
kafka-python consumer that reads it as the baseline of the service's throughput.

    topic = create_topic(kafka.bootstrap, "throughput")
    produce(kafka.bootstrap, topic, workload(500_000, seed=1))
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from multiprocessing import get_context

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from stream_ndcg.devtools.simulator import SimulationSpec, Simulator

# The benches' topics have this many partitions, and the service reads (and the in-process
# pipeline writes) batches of this many records.
PARTITIONS = 4
BATCH = 500


def create_topic(bootstrap: str, name: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])
    admin.close()
    return name


def workload(events: int, seed: int, judged_share: float = 1 / 3, start_ms: int | None = None,
             rate: float = 2_000.0) -> list[tuple[bytes, bytes]]:
    """Zipf queries, 10-result lists, two variants, late judgments for about a third of the shown
    documents: (key, value) messages."""
    spec = SimulationSpec(events=events, seed=seed, queries=20_000, list_length=10, judged_share=judged_share,
                          rate=rate, max_delay_ms=1_800_000,
                          start_ms=start_ms if start_ms is not None else SimulationSpec.start_ms)
    return list(Simulator(spec).messages())


@dataclass(frozen=True)
class BareRun:
    events_per_s: float
    # Process CPU time (user + system, every thread of the consumer's own process) per event.
    cpu_us_per_event: float


# How long the bare consumer may go without a record before it counts as stuck.
STALL_S = 60


def bare_consumer_rate(bootstrap: str, topic: str, total: int, *more_topics: str) -> BareRun:
    """How fast and at what CPU cost a bare kafka-python consumer reads and JSON-decodes the topic
    (and `more_topics`), reading committed records only and with the batch size, as the service
    does; from its first records to `total`, from offset 0.

    The consumer runs in a process of its own, so that the CPU time is its alone, as the service's
    is. Its partitions are assigned, not taken in a group: kafka-python 3.0 sometimes stops fetching
    after a group's rebalance (dpkp/kafka-python#3131), and a bench waiting for records hung. One
    that still gets no record for STALL_S is replaced by a fresh one, once."""
    with get_context("spawn").Pool(1) as pool:
        try:
            return pool.apply(_bare_consumer, (bootstrap, (topic, *more_topics), total))
        except TimeoutError:
            return pool.apply(_bare_consumer, (bootstrap, (topic, *more_topics), total))


def _bare_consumer(bootstrap: str, topics: tuple[str, ...], total: int) -> BareRun:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             max_poll_records=BATCH, isolation_level="read_committed")
    partitions = [TopicPartition(name, number) for name in topics
                  for number in sorted(consumer.partitions_for_topic(name) or ())]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    seen, first, first_cpu, last = 0, 0.0, 0.0, time.perf_counter()
    try:
        while seen < total:
            for records in consumer.poll(timeout_ms=100, max_records=BATCH).values():
                if not first:
                    first, first_cpu = time.perf_counter(), time.process_time()
                for record in records:
                    json.loads(record.value)
                seen += len(records)
                last = time.perf_counter()
            if time.perf_counter() - last > STALL_S:
                raise TimeoutError(f"the bare consumer got no record for {STALL_S} s, {seen} of {total} read")
        return BareRun(seen / (time.perf_counter() - first), 1e6 * (time.process_time() - first_cpu) / seen)
    finally:
        consumer.close()
