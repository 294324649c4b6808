"""The consumer loop: poll, process, commit; shut down on a flag.

Shaped like arroyo's StreamProcessor: `run()` loops until `shutdown()` sets
the flag (SIGTERM and SIGINT call it), finishes the batch in flight, commits
and returns. It reads Kafka through a `Source`, keeps partition ownership in
an `Ownership`, and hands each batch to a `BatchPipeline`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from stream_ndcg.backoff import Backoff
from stream_ndcg.errors import ConsumerStalled, FencedError, RecoverableError, StoreUnavailable, UndecodableRecords
from stream_ndcg.exporter import Exporter
from stream_ndcg.lag import LagReport
from stream_ndcg.ownership import Claim, Ownership, follow_assignment, to_claim
from stream_ndcg.pipeline import BatchPipeline, BatchResult, PartitionBatch
from stream_ndcg.source.base import Partition, Record, Source, StartFrom
from stream_ndcg.state.base import CommitInFlight, StateStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _SentBatch:
    """A batch whose commit is in flight."""

    batch: dict[Partition, list[Record]]
    result: BatchResult
    commit: CommitInFlight
    # The time it took to process and send: what `stream_ndcg_batch_duration_seconds` counts, with
    # the wait for the reply, and without the poll in between.
    seconds: float


@dataclass(frozen=True)
class ProcessorOptions:
    """What the loop reads of the configuration (`wiring.processor_options` makes them of `Settings`)."""

    topics: tuple[str, ...]
    linger_ms: int
    batch_size: int
    # Where a partition with no stored offset starts.
    start_from: StartFrom
    # The metric configuration the state must serve (`reconfigure.configured`).
    metric_config: Mapping[str, object]
    rebuild: bool = False
    fail_on_data_loss: bool = False


class StreamProcessor:
    """Consumes events from a `Source` and keeps the store's state and offsets in step.

    The commit order of every batch:

    1. poll up to `batch_size` records; records of partitions this instance has
       not (yet) claimed are dropped, to be read again from the stored offset
       once it claims them;
    2. parse each record (a bad one becomes a counted rejection, never an error,
       and goes to the dead-letter topic, flushed and acknowledged before step 5);
    3. load the touched query states and the already-applied impression ids of
       each partition from the store (one pipelined round trip);
    4. apply the events with the engine (pure, in memory);
    5. send, per partition and atomically, the new states, the aggregate
       increments, the counts and the partition's next offset, refused if the
       partition's epoch is no longer ours or its stored offset is not the one
       this instance last wrote or read (one round trip);
    6. after a full batch (a catch-up), poll the next while the store writes;
       then read the write's reply (after a smaller one, at once): only a batch
       acknowledged moves the offsets this instance expects, and a refused one
       releases its partitions, whose records just polled are dropped with
       them; nothing of the next batch is loaded before the reply;
    7. only then commit the offsets to Kafka, for lag monitoring alone (at most every
       `LagReport.COMMIT_S`);
    8. a quiet partition whose position moved past transaction markers or
       aborted records gets an offsets-only commit through the same fenced
       write, so that the stored offset reaches the last stable offset.

    Steps 2 to 5 are the `BatchPipeline`. The offsets in the store are the
    truth: on assignment the processor claims the partition (a new epoch,
    fencing any earlier holder) and seeks to the stored offset. A crash before
    step 5 loses nothing (the batch is read again); a crash after it counts
    nothing twice (the stored offset is past the batch). After any store
    failure every partition is claimed and sought again, because a commit
    whose reply was lost may or may not have landed.
    """

    IDLE_CHECK_S = 2.0

    def __init__(self, source: Source, store: StateStore, pipeline: BatchPipeline, exporter: Exporter,
                 options: ProcessorOptions, *, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.store = store
        self.pipeline = pipeline
        self.exporter = exporter
        self.options = options
        # Where a partition with no stored offset starts: the setting, or the beginning after a rebuild.
        self.start_from: StartFrom = options.start_from
        self.clock = clock
        self.backoff = Backoff()
        self.ownership = Ownership()
        self._shutdown = threading.Event()
        self._healthy = False
        # What stream_ndcg_ready last said, to log its changes only.
        self._said_ready = False
        # Partitions held up by a batch this installation cannot decompress: not ready until
        # they move on.
        self._undecodable: set[tuple[str | None, int | None]] = set()
        # Every undecodable fault already logged at ERROR: a rebalance that hands the partition
        # back (and so clears `_undecodable`) must not say it again.
        self._undecodable_said: set[str] = set()
        self._last_contact = time.monotonic()
        self.lag = LagReport(source, exporter)
        # The batch whose commit was sent and whose reply is still to be read (step 6).
        self._sent: _SentBatch | None = None

    # -- lifecycle ---------------------------------------------------------

    def shutdown(self, *_: Any) -> None:
        """Ask run() to stop after the batch in flight (safe from a signal handler)."""
        self._shutdown.set()

    def ready(self) -> bool:
        return self._healthy and self.ownership.settled and not self._undecodable

    def run(self) -> None:
        """Consume until shutdown(); ConfigError if the stored state cannot serve this metric
        configuration (`reconfigure`) and no rebuild was asked for."""
        if not self.start():
            return
        try:
            while not self._shutdown.is_set():
                self.run_once()
        finally:
            self.close()

    def start(self) -> bool:
        """Adopt the state's metric configuration and open the source, waiting out outages;
        False if shutdown() came first."""
        return self._adopt_metric_config() and self._open_source()

    def run_once(self) -> None:
        """One poll and its batch; a transient fault is counted and waited out, never raised."""
        try:
            self._cycle()
            if not self._undecodable:
                # Polls between the failing ones do not end that fault: keep backing off.
                self.backoff.reset()
            self._set_healthy(True)
        except RecoverableError as exc:
            self._recover(exc)

    def close(self) -> None:
        """Read the last batch's reply, commit the stored offsets to Kafka (for lag dashboards) and
        leave the group."""
        try:
            self._finish_commit()
        except RecoverableError as exc:
            # Whether it landed, the stored offset says: the next holder resumes from there.
            logger.warning("the last batch's commit was not acknowledged: %s", exc)
        self.lag.commit(self.ownership, closing=True)
        self.source.close()
        logger.info("stopped")

    def _adopt_metric_config(self) -> bool:
        """Check the state's metric configuration, or record it, retrying while the store is
        unreachable; False on shutdown."""
        while not self._shutdown.is_set():
            try:
                if self.store.adopt(self.options.metric_config, rebuild=self.options.rebuild):
                    logger.warning("state rebuilt for a new metric configuration: consuming from the beginning")
                    self.start_from = "earliest"
                self.backoff.reset()
                return True
            except StoreUnavailable as exc:
                self._back_off(type(exc).__name__, str(exc))
        logger.info("stopped before reaching the store")
        return False

    def _open_source(self) -> bool:
        """Connect, wait until the brokers know every topic, subscribe; retrying while the brokers
        cannot be reached. False on shutdown."""
        while not self._shutdown.is_set():
            try:
                self.source.open()
                break
            except RecoverableError as exc:
                self._back_off(type(exc).__name__, str(exc))
        else:
            logger.info("stopped before connecting to Kafka")
            return False
        missing = list(self.options.topics)
        while missing and not self._shutdown.is_set():
            try:
                missing = self.source.missing_topics(missing)
            except RecoverableError as exc:
                logger.warning("%s", exc)
            if missing:
                delay = self.backoff.next_delay()
                logger.warning("topic(s) %s not found yet; retrying in %.1fs", ", ".join(missing), delay)
                self._shutdown.wait(delay)
        self.backoff.reset()
        self.source.subscribe(self.options.topics)
        logger.info("consuming %s", ", ".join(self.options.topics))
        return True

    def _cycle(self) -> None:
        # With a commit in flight too (see `source.kafka`'s poll): when the topic is quiet the
        # reply is read up to a linger late, and counted from when it came.
        polled = self.source.poll(self.options.linger_ms, self.options.batch_size)
        self._finish_commit()
        self._follow_assignment()
        batch = {p: records for p, records in polled.items() if self.ownership.owns(p)}
        if batch:
            self._process(batch)
            self._last_contact = time.monotonic()
        elif time.monotonic() - self._last_contact > self.IDLE_CHECK_S:
            # Idle: nothing would notice a Redis outage, yet /readyz must tell it.
            self.store.check()
            self._last_contact = time.monotonic()
        self._advance_past_markers(polled.keys())
        self._claim_pending()
        self.lag.report(self.ownership)

    def _recover(self, exc: RecoverableError) -> None:
        level = logging.WARNING
        if isinstance(exc, UndecodableRecords):
            # The same batch fails at every retry until the library is installed: say it once.
            level = logging.DEBUG if str(exc) in self._undecodable_said else logging.ERROR
            self._undecodable_said.add(str(exc))
            self._undecodable.add((exc.topic, exc.partition))
        else:
            # A commit whose reply was lost, or came after a later step failed, may have landed:
            # trust only the stored offsets. (An undecodable batch stops poll() before any write:
            # the claims hold, and the other partitions go on, where claiming again would drop
            # what they fetched; a commit in flight is read after the next poll.)
            self._abandon_commit()
            self.ownership.release_all()
        self._set_healthy(False)
        self._back_off(type(exc).__name__, str(exc), level)
        if isinstance(exc, ConsumerStalled) and not self._shutdown.is_set():
            self.source.close()
            self._open_source()

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

    def _follow_assignment(self) -> None:
        """Bring the partitions this loop works on in line with the group's assignment."""
        follow_assignment(self.ownership, self.source, self._forget)

    def _forget(self, partition: Partition) -> None:
        self._undecodable.discard(partition)
        # The new holder reports this partition's lag from now on.
        self.lag.forget(partition)

    def _claim_pending(self) -> None:
        for partition, epoch in to_claim(self.ownership, self.source, self.store.claim):
            offset = self.store.next_offset(partition.name)
            if offset is not None:
                start = self.source.log_start(partition)
                if offset < start:
                    if not self._skip_lost_records(partition, epoch, offset, start):
                        continue
                    offset = start
            self.source.seek(partition, offset, self.start_from)
            self.ownership.claimed(partition, epoch, offset)
            logger.info("claimed %s (epoch %s), resuming at offset %s", partition.name, epoch,
                        offset if offset is not None else self.start_from)
        self.exporter.assigned_partitions.set(len(self.ownership))

    def _skip_lost_records(self, partition: Partition, epoch: str, offset: int, start: int) -> bool:
        """Whether to go on reading a partition whose stored offset is older than the first one Kafka
        still holds (the service was down longer than the topic's retention, or records were
        deleted). Going on records the gap in the store (an empty batch that moves the offset to the
        log start), so it is counted once; with fail_on_data_loss the partition is halted instead,
        and the service stays not ready until restarted."""
        lost = start - offset
        if self.options.fail_on_data_loss:
            self.ownership.halt(partition)
            logger.error("%s: offsets %d to %d were deleted from Kafka before they were read (retention or "
                         "delete-records); not reading the partition: restart with fail_on_data_loss=false to skip "
                         "them, or rebuild=true to recompute from what Kafka still holds",
                         partition.name, offset, start - 1)
            return False
        self.pipeline.apply(partition.name, epoch, [], start, offset)
        self.exporter.offsets_skipped.labels(topic=partition.topic, partition=str(partition.partition)).inc(lost)
        logger.warning("%s: %d offsets (%d to %d) were deleted from Kafka before they were read (retention or "
                       "delete-records); their events are not counted", partition.name, lost, offset, start - 1)
        return True

    # -- batches -----------------------------------------------------------

    def _process(self, batch: dict[Partition, list[Record]]) -> None:
        started = time.perf_counter()
        now_ms = int(self.clock() * 1000)
        batches = [PartitionBatch(p.name, self.ownership.claim(p).epoch, records, self.ownership.claim(p).offset)
                   for p, records in batch.items()]
        # A full batch: more is waiting, fetched while the store writes. A smaller one (caught up):
        # written and acknowledged at once, as a poll in between would only take the next few
        # records early, and small live batches cost more per event (the judgment-to-metric
        # latency's tail grew near capacity when they overlapped: bench/RESULTS.md).
        overlap = sum(map(len, batch.values())) >= self.options.batch_size
        result, commit = self.pipeline.send(batches, now_ms, overlap=overlap)
        self._sent = _SentBatch(batch, result, commit, time.perf_counter() - started)
        if not overlap:
            self._finish_commit()

    def _abandon_commit(self) -> None:
        """Read the reply of a commit in flight, whatever it says, and forget its batch: after a
        fault the stored offsets decide. (Read, so that its connection goes back to the pool.)"""
        sent, self._sent = self._sent, None
        if sent is not None:
            try:
                sent.commit.finish()
            except (RecoverableError, FencedError) as exc:
                logger.info("a batch's commit in flight at a fault was not acknowledged: %s", exc)

    def _finish_commit(self) -> None:
        """Read the reply of the batch sent last (step 6), and move its partitions on, or let them go."""
        sent, self._sent = self._sent, None
        if sent is None:
            return
        waited = time.perf_counter()
        try:
            acknowledged = sent.commit.finish()
        except FencedError as exc:
            self.exporter.fenced.inc()
            logger.warning("%s", exc)
            # Claim again: if Kafka still assigns them to us, the stored offset is where to resume.
            self.ownership.release(sent.batch)
            return
        for partition, records in sent.batch.items():
            self.ownership.committed(partition, records[-1].offset + 1)
            self._undecodable.discard(partition)
        applied_s = self.clock() - (time.monotonic() - acknowledged)
        for ts in sent.result.judgment_times:
            self.exporter.judgment_latency.observe(max(0.0, applied_s - ts / 1000))
        self.exporter.batch_events.observe(sent.result.records)
        self.exporter.batch_seconds.observe(sent.seconds + time.perf_counter() - waited)
        self.lag.commit(self.ownership)

    def _advance_past_markers(self, polled: Collection[Partition]) -> None:
        """Step 8: move the stored offset of each quiet partition to the consumer's position, when
        the position is past it (markers and aborted records give no record whose offset would)."""
        if self._sent is not None:
            return
        moves: dict[Partition, tuple[Claim, int]] = {}
        for partition, claim in self.ownership.owned():
            if partition in polled or claim.offset is None:
                continue
            position = self.source.position(partition)
            if position is not None and position > claim.offset:
                moves[partition] = (claim, position)
        if not moves:
            return
        try:
            self.pipeline.move_offsets({p.name: (claim.epoch, position, claim.offset)
                                        for p, (claim, position) in moves.items()}, int(self.clock() * 1000))
        except FencedError as exc:
            self.exporter.fenced.inc()
            logger.warning("%s", exc)
            self.ownership.release(moves)
            return
        for partition, (_, position) in moves.items():
            self.ownership.committed(partition, position)
        self.lag.commit(self.ownership)
