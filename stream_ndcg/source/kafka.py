"""The `Source` on kafka-python, and every workaround its consumer needs, in one place (what the
services write goes through `kafka_output.KafkaOutput`).

kafka-python 3.0 faults this adapter works around (each seen in this project's tests):

- joining a group before the brokers know a topic's partitions gives an empty assignment
  and a second rebalance at once, a race a member can lose (it then waits for an
  assignment that never comes): `missing_topics` lets the processor wait for them first;
- a group's leader records the subscribed topics' partitions it assigned against as of the last
  metadata update, which for the first join (the broker answers at once once it has served a
  group) can be the one `missing_topics` made before `subscribe`, recording none; the update a
  moment later differs from that record and makes the member rejoin, so that every partition is
  revoked and claimed again after its first batches: `subscribe` refreshes the metadata before it
  returns;
- `on_partitions_assigned` is not always called after a rebalance (a second one right
  after joining, giving back the same partitions, left a group consuming nothing): the
  assignment is read from the consumer, the listener only reports revocations;
- pause and resume across rebalances have left partitions stuck: nothing is paused;
- `poll()` just returns nothing while no broker answers and there is no public health
  signal: an empty poll with no group coordinator raises `BrokerUnavailable`;
- a batch whose codec's library is missing raises UnsupportedCodecError once, naming only the
  codec, and leaves the fetcher so that the next poll spins forever: `UndecodableRecords`
  names the partition and offset, and the fetcher is unjammed (see `_undecodable_records`);
- a consumer can stop fetching partitions that have records after some rebalances
  (dpkp/kafka-python#3131): a quiet partition's end offset is compared with the position
  every `STALL_CHECK_S`, and `ConsumerStalled` tells the processor to open a new consumer;
  only if some poll since the last check came back short of `max_records`: kafka-python hands
  out its fetched records a partition at a time, so a consumer catching up more slowly than it
  fetches leaves a partition waiting its turn for longer than that while every poll comes back
  full, and reopening it then would only drop its state cache and start again;
- a member can be left out of its group after a rebalance: poll() returned early while the group
  was forming, the assignment that came later was never applied and heartbeats stayed off, so
  the broker dropped the member and it never rejoined while no records came (seen with two
  instances starting together): a member that is not a stable member of its group for
  `UNSTABLE_GROUP_S` raises `ConsumerStalled` too;
- a consumer whose constructor raises (no broker answered within `bootstrap_timeout_ms`: Kafka is
  down at start-up or when the consumer is reopened) has already started its IO thread, which
  goes on reconnecting and holds the client, its sockets and its metrics for the life of the
  process, one more at each attempt (kafka-python 3.0.12; no upstream issue found): `new_consumer`
  closes what such a constructor had made;
- kafka-python reads uncommitted records unless told otherwise, and its `highwater()` is the
  high watermark even under read-committed (it drops the last stable offset that fetch
  responses carry): `consumer_options` always sets `isolation_level="read_committed"`, and
  `stable_ends` asks the brokers (ListOffsets under read-committed answers with the last
  stable offset).

Reading committed records only is not a setting: a producer that writes in transactions
(Kafka Streams, Flink's exactly-once sink, any `transactional.id`) also writes records of
aborted transactions, which must never be counted; for plain producers it changes nothing.
"""

from __future__ import annotations

import logging
import queue
import re
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import IllegalStateError, KafkaError, UnsupportedCodecError
from kafka.structs import MemberState, OffsetAndMetadata

from stream_ndcg.errors import BrokerUnavailable, ConsumerStalled, UndecodableRecords
from stream_ndcg.source.base import Partition, Record, StartFrom

logger = logging.getLogger(__name__)


def consumer_options(client_options: Mapping[str, Any], *, group_id: str, auto_offset_reset: str,
                     batch_size: int, max_message_bytes: int) -> dict[str, Any]:
    """Every option of the service's kafka-python consumer: the connection's (`client_options`)
    and this adapter's choices."""
    return dict(
        **client_options,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset=auto_offset_reset,
        # Records of aborted transactions are skipped, and nothing past the last stable offset
        # is returned (an open transaction holds its partition back, as in every Kafka consumer).
        isolation_level="read_committed",
        max_poll_records=batch_size,
        fetch_max_bytes=max(52_428_800, max_message_bytes),
        max_partition_fetch_bytes=max(1_048_576, max_message_bytes),
        client_id=f"stream-ndcg-{group_id}",
        reconnect_backoff_max_ms=10_000,
        # The loop polls at least every few seconds, even while it backs off from a Redis
        # outage, so a member that stops polling for a minute is stuck, and a rebalance
        # should not wait five minutes (the default) for it.
        max_poll_interval_ms=60_000,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=3_000,
        # New partitions of the subscribed topics are noticed within half a minute.
        metadata_max_age_ms=30_000,
    )


def new_consumer(options: Mapping[str, Any]) -> KafkaConsumer:
    """A kafka-python consumer of `options` (`consumer_options`'s) that leaves nothing running if it
    cannot be made.

        source = KafkaSource(lambda: new_consumer(consumer_options(...)))
    """
    return _ClosedIfUnmade(**options)


class _ClosedIfUnmade(KafkaConsumer):  # type: ignore[misc]
    """A KafkaConsumer whose constructor, when it raises, first closes the client it had started
    (its IO thread starts before the brokers are asked for their versions, and nothing else stops
    it: see the module docstring)."""

    def __init__(self, **options: Any) -> None:
        try:
            super().__init__(**options)
        except BaseException:
            self._close_unmade()
            raise

    def _close_unmade(self) -> None:
        # What KafkaConsumer.close() closes after the group's coordinator, which is made last.
        metrics, client = getattr(self, "_metrics", None), getattr(self, "_client", None)
        try:
            if metrics is not None:
                metrics.close()
            if client is not None:
                client.close()
        except Exception:
            # The constructor's own error is the one to raise; this one is only said.
            logger.warning("closing a Kafka consumer that could not be made failed", exc_info=True)


class KafkaSource:
    """A `Source` over a kafka-python consumer made by `connect` (again after each `close`).

        source = KafkaSource(lambda: new_consumer(consumer_options(...)))
    """

    # After this long without records from a partition, ask the brokers whether it has some.
    STALL_CHECK_S = 15.0
    # Longer than a rebalance may take (the brokers wait up to max_poll_interval_ms, 60 s, for
    # the members to rejoin), so that only a member left out is reopened.
    UNSTABLE_GROUP_S = 90.0

    def __init__(self, connect: Callable[[], KafkaConsumer]) -> None:
        self._connect = connect
        self._consumer: KafkaConsumer | None = None
        self._revocations: queue.SimpleQueue[list[TopicPartition]] = queue.SimpleQueue()
        # When each assigned partition last gave records (or was sought).
        self._last_records: dict[Partition, float] = {}
        self._next_stall_check = 0.0
        # Whether a poll since the last stall check gave fewer records than it asked for: the
        # fetcher had none left over, so a quiet partition then is not merely waiting its turn.
        self._polled_short = False
        # Since when the member has not been a stable member of its group (None: it is).
        self._unstable_since: float | None = None

    @property
    def consumer(self) -> KafkaConsumer:
        if self._consumer is None:
            raise BrokerUnavailable("the Kafka consumer is not open")
        return self._consumer

    def open(self) -> None:
        try:
            self._consumer = self._connect()
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka unreachable ({type(exc).__name__})") from exc

    def missing_topics(self, topics: Collection[str]) -> list[str]:
        try:
            return [t for t in topics if not self.consumer.partitions_for_topic(t)]
        except KafkaError as exc:
            raise BrokerUnavailable(f"topic metadata unavailable: {type(exc).__name__}") from exc

    def partitions_of(self, topics: Collection[str]) -> set[Partition]:
        try:
            return {Partition(t, n) for t in topics for n in self.consumer.partitions_for_topic(t) or ()}
        except KafkaError as exc:
            raise BrokerUnavailable(f"topic metadata unavailable: {type(exc).__name__}") from exc

    def subscribe(self, topics: Collection[str]) -> None:
        self._revocations = queue.SimpleQueue()
        self.consumer.subscribe(list(topics), listener=_Revocations(self._revocations))
        try:
            # Before the first poll joins the group (see the module docstring).
            self.consumer.topics()
        except KafkaError as exc:
            # Only a rebalance more: the poll that follows says whether the brokers are gone. The
            # failed refresh leaves kafka-python asking for every topic's metadata: this consumer
            # needs its own topics' alone.
            self.consumer._cluster.need_all_topic_metadata = False
            logger.info("topic metadata not refreshed before joining the group: %s", type(exc).__name__)
        self._last_records.clear()
        self._unstable_since = None
        self._next_stall_check = time.monotonic() + self.STALL_CHECK_S

    def poll(self, timeout_ms: int, max_records: int) -> dict[Partition, list[Record]]:
        """Records, as the `Source` promises. Never poll with `timeout_ms=0` to make room for other
        work: kafka-python 3.0.12 polled without waiting right after a rebalance stopped fetching
        (tests/integration/test_lost_records.py stalled), so the loop always waits its linger."""
        if time.monotonic() > self._next_stall_check:
            self._check_stalled()
        try:
            polled = self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        except UnsupportedCodecError as exc:
            raise _undecodable_records(self.consumer, exc) from exc
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka poll failed: {type(exc).__name__}: {exc}") from exc
        if not polled and self._coordinator_lost():
            raise BrokerUnavailable("Kafka group coordinator unreachable")
        self._check_membership()
        now = time.monotonic()
        batch: dict[Partition, list[Record]] = {}
        taken = 0
        for tp, records in polled.items():
            partition = Partition(tp.topic, tp.partition)
            batch[partition] = records
            taken += len(records)
            self._last_records[partition] = now
        if taken < max_records:
            self._polled_short = True
        return batch

    def assignment(self) -> set[Partition]:
        return {Partition(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def revoked(self) -> set[Partition]:
        revoked: set[Partition] = set()
        while not self._revocations.empty():
            revoked.update(Partition(tp.topic, tp.partition) for tp in self._revocations.get_nowait())
        return revoked

    def seek(self, partition: Partition, offset: int | None, start_from: StartFrom) -> None:
        tp = TopicPartition(partition.topic, partition.partition)
        if offset is not None:
            self.consumer.seek(tp, offset)
        elif start_from == "earliest":
            self.consumer.seek_to_beginning(tp)
        else:
            self.consumer.seek_to_end(tp)
        self._last_records[partition] = time.monotonic()

    def committed_offset(self, partition: Partition) -> int | None:
        try:
            offset: int | None = self.consumer.committed(TopicPartition(partition.topic, partition.partition))
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka committed offsets unavailable: {type(exc).__name__}: {exc}") from exc
        return offset

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        to_commit = {TopicPartition(p.topic, p.partition): OffsetAndMetadata(offset, "", -1)
                     for p, offset in offsets.items()}
        if not to_commit:
            return
        try:
            if asynchronous:
                self.consumer.commit_async(offsets=to_commit)
            else:
                self.consumer.commit(offsets=to_commit)
        except KafkaError as exc:
            # Kafka's committed offsets only feed lag dashboards; the store's are the truth.
            raise BrokerUnavailable(f"Kafka offset commit failed: {exc}") from exc

    def highwater(self, partition: Partition) -> int | None:
        # The high watermark, from the last fetch response: past open transactions' records.
        highwater: int | None = self.consumer.highwater(TopicPartition(partition.topic, partition.partition))
        return highwater

    def position(self, partition: Partition) -> int | None:
        """The offset of the next record this consumer will return; past control records (the
        markers that end transactions) and aborted records it skipped."""
        tp = TopicPartition(partition.topic, partition.partition)
        try:
            # No wait: a position not known yet (a reset still pending) is None, not a round trip.
            position: int | None = self.consumer.position(tp, timeout_ms=0)
        except IllegalStateError:
            # Taken away by a rebalance that the loop has not seen yet.
            return None
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka position unavailable: {type(exc).__name__}: {exc}") from exc
        return position

    def stable_ends(self, partitions: Collection[Partition]) -> dict[Partition, int]:
        """The last stable offsets (one ListOffsets round trip under read-committed)."""
        if not partitions:
            return {}
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        try:
            ends = self.consumer.end_offsets(tps, timeout_ms=5_000)
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka offsets unavailable: {type(exc).__name__}: {exc}") from exc
        return {Partition(tp.topic, tp.partition): offset for tp, offset in ends.items()}

    def log_start(self, partition: Partition) -> int:
        tp = TopicPartition(partition.topic, partition.partition)
        try:
            start: int = self.consumer.beginning_offsets([tp], timeout_ms=5_000)[tp]
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka offsets unavailable: {type(exc).__name__}: {exc}") from exc
        return start

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None

    def _coordinator_lost(self) -> bool:
        """Whether the consumer has lost its group coordinator, as it does within seconds of the
        brokers going away: this reads what poll() itself last found (an attribute only: the
        coordinator's methods act on the client, which is the IO thread's)."""
        coordinator: Any = self.consumer._coordinator
        return coordinator.coordinator_id is None

    def _check_membership(self) -> None:
        """ConsumerStalled if this member has not been a stable member of its group for
        `UNSTABLE_GROUP_S` (an attribute read, as in `_coordinator_lost`)."""
        coordinator: Any = self.consumer._coordinator
        if getattr(coordinator, "state", MemberState.STABLE) is MemberState.STABLE:
            self._unstable_since = None
            return
        now = time.monotonic()
        if self._unstable_since is None:
            self._unstable_since = now
        elif now - self._unstable_since > self.UNSTABLE_GROUP_S:
            self._unstable_since = None
            raise ConsumerStalled(f"not a stable member of the consumer group for {self.UNSTABLE_GROUP_S:.0f}s "
                                  f"({coordinator.state.strip('<>')}): rejoining the group")

    def _check_stalled(self) -> None:
        """ConsumerStalled if an assigned partition that gave no records lately has some past our
        position, while the consumer had records to spare (a poll came back short)."""
        now = time.monotonic()
        self._next_stall_check = now + self.STALL_CHECK_S
        polled_short, self._polled_short = self._polled_short, False
        assigned = self.consumer.assignment()
        quiet = sorted((tp for tp in assigned
                        if now - self._last_records.setdefault(Partition(tp.topic, tp.partition), now)
                        > self.STALL_CHECK_S), key=lambda tp: (tp.topic, tp.partition))
        if not quiet or not polled_short:
            return
        try:
            # Last stable offsets: a trailing marker or an open transaction is not a record to fetch.
            ends = self.consumer.end_offsets(quiet, timeout_ms=5_000)
            behind = [tp for tp in quiet if ends.get(tp, 0) > self.consumer.position(tp, timeout_ms=5_000)]
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka offsets unavailable: {type(exc).__name__}: {exc}") from exc
        if behind:
            names = ", ".join(f"{tp.topic}:{tp.partition}" for tp in behind)
            raise ConsumerStalled(f"no records for {self.STALL_CHECK_S:.0f}s while {names} have some: "
                                  "rejoining the group")


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


class _Revocations(ConsumerRebalanceListener):  # type: ignore[misc]
    """Queues revocations for the loop (this runs on Kafka's IO thread, where nothing may block);
    fencing, not this callback, keeps writes safe."""

    def __init__(self, revocations: queue.SimpleQueue[list[TopicPartition]]) -> None:
        self.revocations = revocations

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.revocations.put(list(revoked))

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """The assignment is read from the consumer instead (see the module docstring)."""
