"""Where records come from: the small interface the processor reads Kafka through, and its twin.

The processor never touches a Kafka client: it polls, reads the assignment,
seeks and commits through a `Source` (arroyo's `backends/abstract.py` is the
pattern). `source.kafka.KafkaSource` implements it with kafka-python and holds
every workaround that client needs; `source.local.LocalSource` implements it in
memory, so unit tests drive the real processor without a broker.

A source raises only `RecoverableError`s (`BrokerUnavailable`,
`ConsumerStalled`, `UndecodableRecords`): the processor backs off and, after
`ConsumerStalled`, closes the source and opens it again.

    source = LocalSource({"events": 2})
    source.append("events", 0, key=b"q1", value=b'{"type": "impression", ...}')
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Literal, NamedTuple, Protocol

StartFrom = Literal["earliest", "latest"]


class Partition(NamedTuple):
    """One partition of an input topic (equal to kafka-python's TopicPartition of the same pair)."""

    topic: str
    partition: int

    @property
    def name(self) -> str:
        """How the store and the logs name it: ``topic:partition``."""
        return f"{self.topic}:{self.partition}"


class Record(Protocol):
    """One consumed message; kafka-python's ConsumerRecord has this shape as it is."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


class Source(Protocol):
    """A consumer-group member's view of its input topics."""

    def open(self) -> None:
        """Connect (again, after `close`); BrokerUnavailable while the brokers cannot be reached."""
        ...

    def missing_topics(self, topics: Collection[str]) -> list[str]:
        """The topics whose partitions the brokers do not know yet."""
        ...

    def partitions_of(self, topics: Collection[str]) -> set[Partition]:
        """Every partition of these topics the brokers know, assigned to this member or not."""
        ...

    def subscribe(self, topics: Collection[str]) -> None:
        """Join the group for these topics; the assignment then comes with `poll`."""
        ...

    def poll(self, timeout_ms: int, max_records: int) -> dict[Partition, list[Record]]:
        """Up to `max_records` records from the assigned partitions, waiting at most `timeout_ms`."""
        ...

    def assignment(self) -> set[Partition]:
        """The partitions the group gives this member now."""
        ...

    def revoked(self) -> set[Partition]:
        """The partitions taken away since the last call (some may have been given straight back)."""
        ...

    def seek(self, partition: Partition, offset: int | None, start_from: StartFrom) -> None:
        """Read `partition` from `offset`, or from its beginning or end when `offset` is None."""
        ...

    def committed_offset(self, partition: Partition) -> int | None:
        """The group's committed offset of `partition` in Kafka, None if it has none (the
        ubi-bridge keeps its offsets there; `run` keeps its own in the store)."""
        ...

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        """Record the group's position (for lag dashboards only: the store's offsets are the truth)."""
        ...

    def highwater(self, partition: Partition) -> int | None:
        """The partition's high watermark as last seen (past the records of open transactions),
        None if not known yet."""
        ...

    def position(self, partition: Partition) -> int | None:
        """The offset of the next record `poll` returns: past the transactions' markers and the
        aborted records it skipped, which a record's offset never shows. None if not known yet."""
        ...

    def stable_ends(self, partitions: Collection[Partition]) -> dict[Partition, int]:
        """Each partition's last stable offset: the end of what committed transactions and plain
        producers wrote, where reading committed records stops (asks the brokers)."""
        ...

    def log_start(self, partition: Partition) -> int:
        """The first offset the brokers still hold (retention and delete-records move it on)."""
        ...

    def close(self) -> None:
        """Leave the group without committing."""
        ...
