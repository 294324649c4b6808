"""The in-memory twin of the Kafka source: topics as lists, faults on demand."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from stream_ndcg.errors import BrokerUnavailable, RecoverableError
from stream_ndcg.source.base import Partition, Record, StartFrom


@dataclass(frozen=True)
class LocalRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class LocalSource:
    """An in-memory `Source`: topics are lists of records, this member is assigned every partition
    unless a test says otherwise (`assign`), and faults are injected with `fail_next_poll`.

    Transactions as a read-committed consumer sees them: `append_marker` takes an offset that
    `poll` never returns (a commit or abort marker), and `open_transaction` holds the partition
    at its end until `close_transaction`."""

    def __init__(self, topics: Mapping[str, int]) -> None:
        # None at an offset: a transaction marker, skipped by poll.
        self.logs: dict[Partition, list[LocalRecord | None]] = {
            Partition(topic, p): [] for topic, count in topics.items() for p in range(count)}
        self.positions: dict[Partition, int] = {}
        self.committed: dict[Partition, int] = {}
        self.log_starts: dict[Partition, int] = dict.fromkeys(self.logs, 0)
        # Where an open transaction holds a partition: its last stable offset.
        self.open_transactions: dict[Partition, int] = {}
        self.subscribed: tuple[str, ...] = ()
        self.opened = 0
        self.closed = 0
        self._assigned: set[Partition] | None = None
        self._revoked: set[Partition] = set()
        self._faults: list[RecoverableError] = []
        self._open = False

    # -- what tests do ------------------------------------------------------

    def append(self, topic: str, partition: int, *, key: bytes | None, value: bytes | None) -> None:
        log = self.logs[Partition(topic, partition)]
        log.append(LocalRecord(topic, partition, len(log), key, value))

    def append_marker(self, topic: str, partition: int) -> None:
        """A transaction's commit or abort marker: it takes an offset, and is never returned."""
        self.logs[Partition(topic, partition)].append(None)

    def open_transaction(self, topic: str, partition: int) -> None:
        """What follows is held back (past the last stable offset) until `close_transaction`."""
        partition_ = Partition(topic, partition)
        self.open_transactions.setdefault(partition_, len(self.logs[partition_]))

    def close_transaction(self, topic: str, partition: int) -> None:
        self.open_transactions.pop(Partition(topic, partition), None)

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """What retention or the admin API's delete-records does: offsets below `before` are gone."""
        self.log_starts[Partition(topic, partition)] = before

    def assign(self, partitions: Collection[Partition]) -> None:
        """A rebalance: this member now holds `partitions`; the others are revoked."""
        current = self.assignment()
        self._revoked |= current - set(partitions)
        self._assigned = set(partitions)
        for partition in current - set(partitions):
            self.positions.pop(partition, None)

    def fail_next_poll(self, fault: RecoverableError) -> None:
        self._faults.append(fault)

    # -- the Source interface -----------------------------------------------

    def open(self) -> None:
        self._open = True
        self.opened += 1

    def missing_topics(self, topics: Collection[str]) -> list[str]:
        known = {p.topic for p in self.logs}
        return [t for t in topics if t not in known]

    def partitions_of(self, topics: Collection[str]) -> set[Partition]:
        return {p for p in self.logs if p.topic in topics}

    def subscribe(self, topics: Collection[str]) -> None:
        self.subscribed = tuple(topics)

    def poll(self, timeout_ms: int, max_records: int) -> dict[Partition, list[Record]]:
        if not self._open:
            raise BrokerUnavailable("the local source is closed")
        if self._faults:
            raise self._faults.pop(0)
        batch: dict[Partition, list[Record]] = {}
        room = max_records
        for partition in sorted(self.assignment()):
            position = self.positions.get(partition)
            if position is None or room == 0:
                continue
            # Like a Kafka consumer whose position fell out of range: it resets to the log start.
            position = max(position, self.log_starts[partition])
            stable = self._stable_end(partition)
            taken: list[Record] = []
            while position < stable and len(taken) < room:
                record = self.logs[partition][position]
                if record is not None:
                    taken.append(record)
                position += 1
            self.positions[partition] = position
            if taken:
                batch[partition] = taken
                room -= len(taken)
        return batch

    def assignment(self) -> set[Partition]:
        if not self.subscribed:
            return set()
        if self._assigned is not None:
            return set(self._assigned)
        return {p for p in self.logs if p.topic in self.subscribed}

    def revoked(self) -> set[Partition]:
        revoked, self._revoked = self._revoked, set()
        return revoked

    def seek(self, partition: Partition, offset: int | None, start_from: StartFrom) -> None:
        if offset is None:
            offset = 0 if start_from == "earliest" else len(self.logs[partition])
        self.positions[partition] = offset

    def committed_offset(self, partition: Partition) -> int | None:
        return self.committed.get(partition)

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        self.committed.update(offsets)

    def highwater(self, partition: Partition) -> int | None:
        return len(self.logs[partition])

    def position(self, partition: Partition) -> int | None:
        return self.positions.get(partition)

    def stable_ends(self, partitions: Collection[Partition]) -> dict[Partition, int]:
        return {p: self._stable_end(p) for p in partitions}

    def log_start(self, partition: Partition) -> int:
        return self.log_starts[partition]

    def _stable_end(self, partition: Partition) -> int:
        return self.open_transactions.get(partition, len(self.logs[partition]))

    def close(self) -> None:
        self._open = False
        self.closed += 1
