"""The consumer loop: poll, parse, apply, commit; shut down on a flag.

Shaped like arroyo's StreamProcessor: `run()` loops until `shutdown()` sets
the flag (SIGTERM and SIGINT call it), finishes the batch in flight, commits
and returns.
"""

from __future__ import annotations

import logging
import queue
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import KafkaError, MessageSizeTooLargeError, UnsupportedCodecError
from kafka.structs import OffsetAndMetadata

from stream_ndcg.config import Settings
from stream_ndcg.engine import Engine
from stream_ndcg.errors import (
    BrokerUnavailable,
    ConsumerStalled,
    FencedError,
    RecoverableError,
    StoreUnavailable,
    UndecodableRecords,
)
from stream_ndcg.events import Event, Impression, InvalidEvent, Judgment, Limits, parse_event
from stream_ndcg.exporter import Exporter
from stream_ndcg.store import Commit, StateStore

logger = logging.getLogger(__name__)


def partition_name(tp: TopicPartition) -> str:
    return f"{tp.topic}:{tp.partition}"


class Backoff:
    """Exponential backoff with full jitter: never spins, never waits more than `cap` seconds."""

    def __init__(self, base: float = 0.2, cap: float = 10.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next_delay(self) -> float:
        self.failures += 1
        return random.uniform(self.base, min(self.cap, self.base * 2 ** self.failures))  # noqa: S311

    def reset(self) -> None:
        self.failures = 0


class DeadLetters:
    """Writes rejected messages, byte for byte, to a dead-letter topic with the reason in headers.

    A tombstone without a key goes out as an empty value with ``stream_ndcg.null_value: 1`` (Kafka
    takes no record with neither); one too large for the producer is dropped, logged and counted.
    """

    def __init__(self, connect: Callable[[], KafkaProducer], topic: str,
                 on_dropped: Callable[[], None] = lambda: None) -> None:
        self._connect = connect
        self._producer: KafkaProducer | None = None
        self._pending: list[Any] = []
        self.topic = topic
        self.on_dropped = on_dropped

    @property
    def producer(self) -> KafkaProducer:
        # Created on first use, inside the loop's backoff: the brokers may be down at start.
        if self._producer is None:
            try:
                self._producer = self._connect()
            except KafkaError as exc:
                raise BrokerUnavailable(f"dead-letter producer cannot connect: {type(exc).__name__}") from exc
        return self._producer

    def send(self, record: Any, reason: str) -> None:
        headers = [
            ("stream_ndcg.reason", reason.encode()),
            ("stream_ndcg.topic", record.topic.encode()),
            ("stream_ndcg.partition", str(record.partition).encode()),
            ("stream_ndcg.offset", str(record.offset).encode()),
        ]
        value = record.value
        if record.key is None and value is None:
            value = b""
            headers.append(("stream_ndcg.null_value", b"1"))
        try:
            self._pending.append(self.producer.send(self.topic, key=record.key, value=value, headers=headers))
        except MessageSizeTooLargeError:
            self.on_dropped()
            logger.warning("dead letter from %s:%s@%s too large for the producer; dropped",
                           record.topic, record.partition, record.offset)
        except KafkaError as exc:
            raise BrokerUnavailable(f"dead-letter topic {self.topic} unreachable: {exc}") from exc

    def flush(self) -> None:
        """Wait until every dead letter of the batch is acknowledged; BrokerUnavailable if one is not."""
        pending, self._pending = self._pending, []
        try:
            self.producer.flush(timeout=30)
        except KafkaError as exc:
            raise BrokerUnavailable(f"dead-letter topic {self.topic} unreachable: {exc}") from exc
        failed = [future for future in pending if not future.succeeded()]
        if failed:
            raise BrokerUnavailable(f"{len(failed)} dead letter(s) not acknowledged by {self.topic}")


class SegmentProjector:
    """Maps an impression's segment to the allowlisted labels, each capped in distinct values.

    A label the impression lacks becomes "none"; a value past the cap becomes
    "other". The admitted values live in the store, so every instance agrees.
    """

    OVERFLOW = "other"
    MISSING = "none"
    # Segments seen, remembered with their projection (admission never changes its answer);
    # forgotten all at once when this many, since producers may send any number of them.
    REMEMBERED = 10_000

    def __init__(self, store: StateStore, labels: tuple[str, ...], cap: int) -> None:
        self.store = store
        self.labels = labels
        self.cap = cap
        self._projections: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}

    def project(self, event: Impression) -> Impression:
        projected = self._projections.get(event.segment)
        if projected is None:
            projected = self._project(event.segment)
            if len(self._projections) >= self.REMEMBERED:
                self._projections.clear()
            self._projections[event.segment] = projected
        return Impression(event.impression_id, event.query_id, event.ts, event.results, projected, event.event_id)

    def _project(self, segment: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        given = dict(segment)
        projected = []
        for label in self.labels:
            value = given.get(label)
            if value is None:
                value = self.MISSING
            elif value in (self.MISSING, self.OVERFLOW) or not self.store.admit(label, value, self.cap):
                value = self.OVERFLOW
            projected.append((label, value))
        return tuple(projected)


class StreamProcessor:
    """Consumes events from Kafka and keeps the store's state and offsets in step.

    The commit order of every batch:

    1. poll up to `batch_size` records; records of partitions this instance has
       not (yet) claimed are dropped, to be read again from the stored offset
       once it claims them;
    2. parse each record (a bad one becomes a counted rejection, never an error,
       and goes to the dead-letter topic, flushed and acknowledged before step 5);
    3. load the touched query states and the already-applied impression ids of
       each partition from the store (one pipelined round trip);
    4. apply the events with the engine (pure, in memory);
    5. write, per partition and atomically, the new states, the aggregate
       increments, the counts and the partition's next offset, refused if the
       partition's epoch is no longer ours or its stored offset is not the one
       this instance last wrote or read (one round trip);
    6. only then commit the offsets to Kafka, for lag monitoring alone.

    The offsets in the store are the truth: on assignment the processor claims
    the partition (a new epoch, fencing any earlier holder) and seeks to the
    stored offset. A crash before step 5 loses nothing (the batch is read
    again); a crash after it counts nothing twice (the stored offset is past
    the batch). After any store failure every partition is claimed and sought
    again, because a commit whose reply was lost may or may not have landed.
    """

    IDLE_CHECK_S = 2.0
    # After this long without records from a partition, ask the brokers whether it has some.
    STALL_CHECK_S = 15.0
    consumer: KafkaConsumer

    def __init__(
        self,
        connect: Callable[[], KafkaConsumer],
        store: StateStore,
        engine: Engine,
        exporter: Exporter,
        settings: Settings,
        *,
        projector: SegmentProjector | None = None,
        dead_letters: DeadLetters | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._connect = connect
        self.store = store
        self.engine = engine
        self.exporter = exporter
        self.settings = settings
        self.limits = Limits(max_results=settings.max_results, max_message_bytes=settings.max_message_bytes)
        self.event_clock = settings.clock == "event"
        # Where a partition with no stored offset starts: the setting, or the beginning after a rebuild.
        self.start_from = settings.auto_offset_reset
        self.projector = projector
        self.dead_letters = dead_letters
        self.clock = clock
        self.backoff = Backoff()
        self._shutdown = threading.Event()
        self._owned: dict[TopicPartition, str] = {}
        self._unclaimed: set[TopicPartition] = set()
        self._next_offsets: dict[TopicPartition, int] = {}
        # What this instance knows the store holds: every commit must start from it.
        self._stored_offsets: dict[TopicPartition, int | None] = {}
        self._healthy = False
        # What stream_ndcg_ready last said, to log its changes only.
        self._said_ready = False
        # Partitions held up by a batch this installation cannot decompress, with the fault:
        # not ready until they move on, and the fault logged once, not at every retry.
        self._undecodable: dict[tuple[str | None, int | None], str] = {}
        self._last_contact = time.monotonic()
        # When each owned partition last gave records (or was claimed).
        self._last_records: dict[TopicPartition, float] = {}
        self._next_stall_check = 0.0  # set on subscribing
        self._rebalances: queue.SimpleQueue[tuple[str, list[TopicPartition]]] = queue.SimpleQueue()

    # -- lifecycle ---------------------------------------------------------

    def shutdown(self, *_: Any) -> None:
        """Ask run() to stop after the batch in flight (safe from a signal handler)."""
        self._shutdown.set()

    def ready(self) -> bool:
        return self._healthy and not self._unclaimed and not self._undecodable

    def run(self) -> None:
        """Consume until shutdown(); ConfigError if the stored state was built with another
        metric configuration (and no rebuild was asked for)."""
        if not self._adopt_metric_config() or not self._connect_consumer():
            return
        try:
            self._subscribe()
            while not self._shutdown.is_set():
                try:
                    self._cycle()
                    if not self._undecodable:
                        # Polls between the failing ones do not end that fault: keep backing off.
                        self.backoff.reset()
                    self._set_healthy(True)
                except RecoverableError as exc:
                    self._recover(exc)
        finally:
            self._commit_kafka_offsets()
            self.consumer.close(autocommit=False)
            logger.info("stopped")

    def _subscribe(self) -> None:
        self._await_topics()
        self._rebalances = queue.SimpleQueue()
        self.consumer.subscribe(list(self.settings.topics), listener=_Rebalance(self._rebalances))
        self._next_stall_check = time.monotonic() + self.STALL_CHECK_S
        logger.info("consuming %s", ", ".join(self.settings.topics))

    def _adopt_metric_config(self) -> bool:
        """Check the state's metric configuration, or record it, retrying while the store is
        unreachable; False on shutdown."""
        while not self._shutdown.is_set():
            try:
                if self.store.adopt(self.settings.metric_config, rebuild=self.settings.rebuild):
                    logger.warning("state rebuilt for a new metric configuration: consuming from the beginning")
                    self.start_from = "earliest"
                self.backoff.reset()
                return True
            except StoreUnavailable as exc:
                self._back_off(type(exc).__name__, str(exc))
        logger.info("stopped before reaching the store")
        return False

    def _connect_consumer(self) -> bool:
        """Create the Kafka consumer, retrying while the brokers cannot be reached; False on shutdown."""
        while not self._shutdown.is_set():
            try:
                self.consumer = self._connect()
                self.backoff.reset()
                return True
            except KafkaError as exc:
                self._back_off("BrokerUnavailable", f"Kafka unreachable ({type(exc).__name__})")
        logger.info("stopped before connecting to Kafka")
        return False

    def _await_topics(self) -> None:
        """Wait until the broker knows every topic's partitions. Joining the group before that
        gives an empty assignment and a second rebalance at once, a race that kafka-python
        3.0 can lose (a member then waits for an assignment that never comes)."""
        missing = list(self.settings.topics)
        while missing and not self._shutdown.is_set():
            try:
                missing = [t for t in missing if not self.consumer.partitions_for_topic(t)]
            except KafkaError as exc:
                logger.warning("topic metadata unavailable: %s", type(exc).__name__)
            if missing:
                delay = self.backoff.next_delay()
                logger.warning("topic(s) %s not found yet; retrying in %.1fs", ", ".join(missing), delay)
                self._shutdown.wait(delay)
        self.backoff.reset()

    def _cycle(self) -> None:
        try:
            polled = self.consumer.poll(timeout_ms=self.settings.linger, max_records=self.settings.batch_size)
        except UnsupportedCodecError as exc:
            raise self._undecodable_records(self.consumer, exc) from exc
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka poll failed: {type(exc).__name__}: {exc}") from exc
        self._apply_rebalances()
        batch = {tp: records for tp, records in polled.items() if tp in self._owned}
        if batch:
            self._process(batch)
            self._last_contact = time.monotonic()
            self._last_records.update(dict.fromkeys(batch, self._last_contact))
        elif not polled and self._coordinator_lost():
            raise BrokerUnavailable("Kafka group coordinator unreachable")
        elif time.monotonic() - self._last_contact > self.IDLE_CHECK_S:
            # Idle: nothing would notice a Redis outage, yet /readyz must tell it.
            self.store.check()
            self._last_contact = time.monotonic()
        if time.monotonic() > self._next_stall_check:
            self._check_stalled()
        self._claim_pending()
        self._report_lag()

    @staticmethod
    def _undecodable_records(consumer: KafkaConsumer, exc: UnsupportedCodecError) -> UndecodableRecords:
        """Say which partition, offset and codec poll() could not decompress, and unjam the consumer.

        kafka-python 3.0's error names only the codec ("Libraries for zstd compression codec not
        found"); the partition and offset are those of the fetcher's records in progress, the
        PartitionRecords whose batch raised. kafka-python 3.0.12 leaves that object in place,
        exhausted but not drained, and the next poll() then spins forever in
        Fetcher.fetched_records (seen here; no upstream issue found). Drained, the partition is
        fetched again from the same offset and poll() raises again: a retry, not a hang.
        """
        named = re.search(r"for (\w+) compression codec", str(exc))
        codec = named.group(1) if named else f"an unknown codec ({exc})"
        # The packages kafka.codec imports (kafka-python's extras lz4, snappy and zstd).
        package = {"snappy": "python-snappy", "lz4": "lz4", "zstd": "zstandard"}.get(codec)
        remedy = (f"install the Python package {package}, a dependency of stream-ndcg, and restart"
                  if package else "no Python library decompresses it: check what the producers use")
        stuck = getattr(getattr(consumer, "_fetcher", None), "_next_partition_records", None)
        if stuck is None:
            return UndecodableRecords(codec, None, None, None, remedy)
        stuck.drain()
        return UndecodableRecords(codec, stuck.topic_partition.topic, stuck.topic_partition.partition,
                                  stuck.next_fetch_offset, remedy)

    def _coordinator_lost(self) -> bool:
        """Whether the consumer has lost its group coordinator, as it does within seconds of the
        brokers going away. kafka-python's poll() just returns nothing while no broker answers
        and it has no public health signal, so this reads what poll() itself last found (an
        attribute only: the coordinator's methods act on the client, which is the IO thread's)."""
        return self.consumer._coordinator.coordinator_id is None

    def _check_stalled(self) -> None:
        """ConsumerStalled if an owned partition that gave no records lately has some past our position."""
        now = time.monotonic()
        self._next_stall_check = now + self.STALL_CHECK_S
        quiet = sorted((tp for tp in self._owned if now - self._last_records.get(tp, now) > self.STALL_CHECK_S),
                       key=partition_name)
        if not quiet:
            return
        try:
            ends = self.consumer.end_offsets(quiet, timeout_ms=5_000)
            behind = [tp for tp in quiet if ends.get(tp, 0) > self.consumer.position(tp, timeout_ms=5_000)]
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka offsets unavailable: {type(exc).__name__}: {exc}") from exc
        if behind:
            raise ConsumerStalled(f"no records for {self.STALL_CHECK_S:.0f}s while "
                                  f"{', '.join(map(partition_name, behind))} have some: rejoining the group")

    def _recover(self, exc: RecoverableError) -> None:
        level = logging.WARNING
        if isinstance(exc, UndecodableRecords):
            # The same batch fails at every retry until the library is installed: say it once.
            level = logging.DEBUG if str(exc) in self._undecodable.values() else logging.ERROR
            self._undecodable[(exc.topic, exc.partition)] = str(exc)
        else:
            # A commit whose reply was lost may have landed: trust only the stored offsets. (An
            # undecodable batch stops poll() before any write: the claims hold, and the other
            # partitions go on, where claiming again would drop what they fetched.)
            self._unclaimed.update(self._owned)
            self._owned.clear()
        self._set_healthy(False)
        self._back_off(type(exc).__name__, str(exc), level)
        if isinstance(exc, ConsumerStalled) and not self._shutdown.is_set():
            self.consumer.close(autocommit=False)
            if self._connect_consumer():
                self._subscribe()

    def _back_off(self, cause: str, fault: str, level: int = logging.WARNING) -> None:
        """Count the fault by cause, say so, and wait a jittered delay (cut short by shutdown)."""
        self.exporter.backoffs.labels(cause=cause).inc()
        delay = self.backoff.next_delay()
        logger.log(level, "%s; retrying in %.1fs", fault, delay)
        self._shutdown.wait(delay)

    def _set_healthy(self, healthy: bool) -> None:
        self._healthy = healthy
        ready = self.ready()
        if ready != self._said_ready:
            logger.info("ready" if ready else "not ready")
            self._said_ready = ready
        self.exporter.ready.set(1 if ready else 0)

    # -- partitions --------------------------------------------------------

    def _apply_rebalances(self) -> None:
        """Bring the partitions this loop works on in line with the consumer's assignment.

        Nothing is paused: records of a partition not yet claimed are dropped, and the claim
        seeks to the stored offset (pause and resume across rebalances have left partitions
        stuck in kafka-python 3.0).

        The listener runs on Kafka's IO thread, where nothing may block, and only queues what
        happened; the store is called from this loop, with backoff. A partition revoked and
        given straight back is claimed again. The assignment itself is read from the consumer,
        because kafka-python 3.0 does not always call on_partitions_assigned after a
        rebalance (seen here: a second rebalance right after joining, giving back the same
        partitions, left the group consuming nothing).
        """
        revoked: set[TopicPartition] = set()
        while not self._rebalances.empty():
            kind, partitions = self._rebalances.get_nowait()
            if kind == "revoked":
                revoked.update(partitions)
        current = set(self.consumer.assignment())
        held = set(self._owned) | self._unclaimed
        gone = (held - current) | (revoked & held)
        for tp in gone:
            self._owned.pop(tp, None)
            self._unclaimed.discard(tp)
            self._next_offsets.pop(tp, None)
            self._undecodable.pop((tp.topic, tp.partition), None)
            # The new holder reports this partition's lag from now on.
            try:
                self.exporter.consumer_lag.remove(tp.topic, str(tp.partition))
            except KeyError:
                pass
        if gone:
            logger.info("revoked %s", ", ".join(sorted(map(partition_name, gone))))
        new = current - set(self._owned) - self._unclaimed
        if new:
            self._unclaimed.update(new)
            logger.info("assigned %s", ", ".join(sorted(map(partition_name, new))))

    def _claim_pending(self) -> None:
        assignment = self.consumer.assignment()
        for tp in sorted(self._unclaimed, key=partition_name):
            if tp not in assignment:
                self._unclaimed.discard(tp)
                continue
            name = partition_name(tp)
            epoch = self.store.claim(name)
            offset = self.store.next_offset(name)
            self._stored_offsets[tp] = offset
            if offset is not None:
                self.consumer.seek(tp, offset)
                self._next_offsets[tp] = offset
            elif self.start_from == "earliest":
                self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek_to_end(tp)
            self._owned[tp] = epoch
            self._last_records[tp] = time.monotonic()
            self._unclaimed.discard(tp)
            logger.info("claimed %s (epoch %s), resuming at offset %s", name, epoch,
                        offset if offset is not None else self.start_from)
        self.exporter.assigned_partitions.set(len(self._owned))

    # -- batches -----------------------------------------------------------

    def _process(self, batch: dict[TopicPartition, list[Any]]) -> None:
        started = time.perf_counter()
        now_ms = int(self.clock() * 1000)
        parsed: dict[TopicPartition, list[Event | InvalidEvent]] = {}
        for tp, records in batch.items():
            events: list[Event | InvalidEvent] = []
            for record in records:
                event = self._parse(record, now_ms)
                if isinstance(event, InvalidEvent) and self.dead_letters is not None:
                    self.dead_letters.send(record, event.reason)
                events.append(event)
            parsed[tp] = events
        if self.dead_letters is not None:
            # Before the commit: a rejected message is in the dead-letter topic before its
            # offset counts as consumed (at least once there; a crash may send it twice).
            self.dead_letters.flush()
        commits = []
        judgment_times: list[int] = []
        for tp, events in parsed.items():
            name = partition_name(tp)
            valid = [e for e in events if not isinstance(e, InvalidEvent)]
            snapshot = self.store.load(
                name,
                {e.query_id for e in valid},
                {e.impression_id: self.engine.bucket_of(e.ts) for e in valid if isinstance(e, Impression)},
            )
            clock = snapshot.clock_ms if self.event_clock else now_ms
            outcome = self.engine.apply(events, snapshot.states, snapshot.known_impressions, clock,
                                        event_clock=self.event_clock)
            commits.append(Commit(name, self._owned[tp], outcome, batch[tp][-1].offset + 1,
                                  self._stored_offsets.get(tp)))
            judgment_times.extend(e.ts for e in valid if isinstance(e, Judgment))
        try:
            self.store.commit(commits)
        except FencedError as exc:
            self.exporter.fenced.inc()
            logger.warning("%s", exc)
            # Claim again: if Kafka still assigns them to us, the stored offset is where to resume.
            for tp in batch:
                self._owned.pop(tp, None)
                self._unclaimed.add(tp)
            return
        for tp, records in batch.items():
            self._next_offsets[tp] = self._stored_offsets[tp] = records[-1].offset + 1
            self._undecodable.pop((tp.topic, tp.partition), None)
        applied_s = self.clock()
        for ts in judgment_times:
            self.exporter.judgment_latency.observe(max(0.0, applied_s - ts / 1000))
        self.exporter.batch_events.observe(sum(len(r) for r in batch.values()))
        self.exporter.batch_seconds.observe(time.perf_counter() - started)
        self._commit_kafka_offsets(asynchronous=True)

    def _parse(self, record: Any, now_ms: int) -> Event | InvalidEvent:
        """The contract, plus what only the service can check: the key and the wall clock."""
        event = parse_event(record.value, self.limits)
        if isinstance(event, InvalidEvent):
            return event
        if self.settings.require_key and not record.key:
            return InvalidEvent("missing_key", "messages must be keyed by query_id")
        if event.ts > now_ms + self.settings.max_future:
            return InvalidEvent("ts_in_future", f"ts {event.ts} is more than {self.settings.max_future} ms ahead")
        if isinstance(event, Impression) and self.projector is not None:
            return self.projector.project(event)
        return event

    def _commit_kafka_offsets(self, asynchronous: bool = False) -> None:
        offsets = {tp: OffsetAndMetadata(offset, "", -1)
                   for tp, offset in self._next_offsets.items() if tp in self._owned}
        if not offsets:
            return
        try:
            if asynchronous:
                self.consumer.commit_async(offsets=offsets)
            else:
                self.consumer.commit(offsets=offsets)
        except KafkaError as exc:
            # Kafka's committed offsets only feed lag dashboards; the store's are the truth.
            logger.info("Kafka offset commit skipped: %s", exc)

    def _report_lag(self) -> None:
        for tp in self._owned:
            highwater = self.consumer.highwater(tp)
            position = self._next_offsets.get(tp)
            if highwater is not None and position is not None:
                self.exporter.consumer_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(
                    max(0, highwater - position))


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Queues assignment changes for the loop; fencing, not this callback, keeps writes safe."""

    def __init__(self, changes: queue.SimpleQueue[tuple[str, list[TopicPartition]]]) -> None:
        self.changes = changes

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.changes.put(("revoked", list(revoked)))

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.changes.put(("assigned", list(assigned)))
