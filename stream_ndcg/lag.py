"""The consumer lag, against the last stable offset, and what an open transaction holds back; and
the group's committed offsets in Kafka, which lag dashboards outside read.

A read-committed consumer reads up to a partition's last stable offset (LSO): the end of what
committed transactions and plain producers wrote. The lag is the LSO less the stored offset, so
it reaches 0 once everything committed is read (transaction markers included, see step 8 of
`StreamProcessor`'s commit order); the offsets past the LSO (the high watermark less the LSO)
wait behind a transaction still open, and are exported apart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from stream_ndcg.errors import RecoverableError
from stream_ndcg.exporter import Exporter
from stream_ndcg.ownership import Ownership
from stream_ndcg.source.base import Partition, Source

logger = logging.getLogger(__name__)


class LagReport:
    """Sets `stream_ndcg_consumer_lag` and `stream_ndcg_consumer_held_back_offsets` for the
    partitions an instance owns, asking the brokers at most every `CHECK_S`; commits the owned
    partitions' stored offsets to Kafka at most every `COMMIT_S` (`commit`)."""

    # The last stable offset takes a round trip to the partitions' leaders.
    CHECK_S = 2.0
    # Kafka's committed offsets feed lag dashboards only (the store's are the truth), and a
    # commit costs the client far more CPU than a batch's share of it (bench/RESULTS.md, Service).
    COMMIT_S = 1.0

    def __init__(self, source: Source, exporter: Exporter) -> None:
        self.source = source
        self.exporter = exporter
        self.clock: Callable[[], float] = time.monotonic
        self._next_check = 0.0
        self._next_commit = 0.0
        # A commit put off by `COMMIT_S`, made by a later `commit` or `report`.
        self._commit_due = False

    def commit(self, ownership: Ownership, *, closing: bool = False) -> None:
        """Commit the owned partitions' stored offsets to Kafka, asynchronously, unless the last
        commit was less than `COMMIT_S` ago; when `closing`, at once, waiting for the reply."""
        now = self.clock()
        if not closing and now < self._next_commit:
            self._commit_due = True
            return
        self._next_commit, self._commit_due = now + self.COMMIT_S, False
        try:
            self.source.commit(ownership.offsets(), asynchronous=not closing)
        except RecoverableError as exc:
            logger.info("Kafka offset commit skipped: %s", exc)

    def report(self, ownership: Ownership) -> None:
        """Make a commit put off, once due (a quiet topic has no batch to make it); then the lag."""
        if self._commit_due:
            self.commit(ownership)
        now = self.clock()
        if now < self._next_check:
            return
        self._next_check = now + self.CHECK_S
        owned = {partition: claim.offset for partition, claim in ownership.owned() if claim.offset is not None}
        try:
            stable_ends = self.source.stable_ends(list(owned))
        except RecoverableError as exc:
            # The lag waits for the next check; consuming goes on.
            logger.info("consumer lag not updated: %s", exc)
            return
        for partition, stable in stable_ends.items():
            labels = (partition.topic, str(partition.partition))
            self.exporter.consumer_lag.labels(*labels).set(max(0, stable - owned[partition]))
            highwater = self.source.highwater(partition)
            self.exporter.consumer_held_back.labels(*labels).set(max(0, (highwater or stable) - stable))

    def forget(self, partition: Partition) -> None:
        """The partition went to another instance, which reports it from now on."""
        for gauge in (self.exporter.consumer_lag, self.exporter.consumer_held_back):
            try:
                gauge.remove(partition.topic, str(partition.partition))
            except KeyError:
                pass
