"""`stream-ndcg judge`'s loop: impressions and clicks in, judgment events out, exactly once.

Shaped like `consumer.StreamProcessor`, with a `JudgeStore` for the state and a `Publisher`
for the judgments. Each owned partition has a `ClickJudge` in memory, loaded from the store
when the partition is claimed (a new epoch, which fences any earlier holder) and written back
with every batch. The commit order of each cycle:

1. poll; records of partitions not (yet) claimed are dropped, to be read again from the
   stored offset once claimed; the others queue behind their partition's judge;
2. per partition: a boundary it waits at is decided once every partition of the input
   topics is past it (read from the store, so only committed closes count; a partition whose
   clock started past it has nothing to add), with the rank counts they closed it with,
   summed: the judgments it emits go to the outbox; then queued records are applied until
   one passes a boundary not decided yet, which the judge closes and waits at (that record
   stays queued); a partition with nothing to read for `idle_ms` closes the boundary another
   partition waits at (see docs/click-judgments.md).
   On the wall clock (`JudgeOptions.wall_clock`) a partition closes a boundary once the wall
   time passes it, before it applies any record, and takes the records in at the wall time;
3. every partition's changes, next offset, outbox additions and closed rank counts are
   committed, one atomic fenced script each (`JudgeStore.commit`);
4. only then the outbox is published to the partition the judgments were derived from (acks
   from all in-sync replicas, idempotent producer), and dropped from the store once the
   brokers have it.

A crash before 3 loses nothing (the records are read again); after 3 and before 4 the next
holder publishes the stored outbox; after 4 and before its drop, the same events go out again
with the same event ids, which `run` counts as duplicates. Any fault drops every judge in
memory: the stored state and offsets decide.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from stream_ndcg.backoff import Backoff
from stream_ndcg.click_judge import ClickJudge, JudgeSettings
from stream_ndcg.errors import ConsumerStalled, FencedError, RecoverableError, StoreUnavailable
from stream_ndcg.events import Click, Impression, InvalidEvent, Judgment
from stream_ndcg.exporter import Exporter
from stream_ndcg.judge_boundaries import close, decidable, decide, idle_boundary, waiting_at
from stream_ndcg.lag import LagReport
from stream_ndcg.ownership import Ownership, follow_assignment, to_claim
from stream_ndcg.pipeline import RecordChecks, checked_event
from stream_ndcg.source.base import Partition, Record, Source, StartFrom
from stream_ndcg.state.judge_store import JudgeCommit, JudgeStore, Status
from stream_ndcg.vocabulary import JUDGMENT, rejected

logger = logging.getLogger(__name__)


class Publisher(Protocol):
    def publish(self, partition: Partition, messages: Sequence[bytes]) -> None:
        """Send judgment events (JSON) to `partition`, keyed by their query id, and wait until the
        brokers have them all; BrokerUnavailable if not."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class JudgeOptions:
    """What the judge's loop reads of the configuration (`judge_service.build` makes them)."""

    topics: tuple[str, ...]
    linger_ms: int
    batch_size: int
    start_from: StartFrom
    # How long a partition has had nothing to read before it counts as past a boundary others wait at.
    idle_ms: int
    checks: RecordChecks = RecordChecks()
    # Boundaries by the wall clock (`clock = wall`), not by each partition's greatest event time.
    wall_clock: bool = False


@dataclass
class _Held:
    """An owned partition's judge, its records read and not yet applied, and its outbox."""

    judge: ClickJudge
    pending: deque[Record] = field(default_factory=deque)
    outbox: list[bytes] = field(default_factory=list)
    # Since when it has had nothing to read (monotonic seconds; None: it has).
    idle_since: float | None = None


class JudgeProcessor:
    """Consumes impressions and clicks from a `Source` and keeps the judges, offsets and outboxes
    in the store in step; publishes what the judges decide."""

    # How often the positions of quiet partitions are compared with the ends of their logs.
    IDLE_CHECK_S = 1.0
    # How often the partitions of the input topics are asked of the brokers.
    PARTITIONS_CHECK_S = 30.0
    IDLE_STORE_CHECK_S = 2.0

    def __init__(self, source: Source, store: JudgeStore, publisher: Publisher, exporter: Exporter,
                 options: JudgeOptions, settings: JudgeSettings, *, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.store = store
        self.publisher = publisher
        self.exporter = exporter
        self.options = options
        self.settings = settings
        self.clock = clock
        self.backoff = Backoff()
        self.ownership = Ownership()
        self.lag = LagReport(source, exporter)
        self.held: dict[Partition, _Held] = {}
        # Records queued per partition at most: beyond, they are read again once it moves on.
        self.max_pending = 4 * options.batch_size
        self._shutdown = threading.Event()
        self._healthy = False
        self._partitions: set[str] = set()
        self._partitions_due = 0.0
        self._idle_due = 0.0
        self._last_contact = time.monotonic()

    # -- lifecycle ---------------------------------------------------------

    def shutdown(self, *_: object) -> None:
        """Ask run() to stop after the cycle in flight (safe from a signal handler)."""
        self._shutdown.set()

    def ready(self) -> bool:
        return self._healthy and self.ownership.settled

    def run(self) -> None:
        if not self.start():
            return
        try:
            while not self._shutdown.is_set():
                self.run_once()
        finally:
            self.close()

    def start(self) -> bool:
        """Check the stored state's format and open the source, waiting out outages; False on shutdown."""
        while not self._shutdown.is_set():
            try:
                self.store.adopt()
                break
            except StoreUnavailable as exc:
                self._back_off(type(exc).__name__, str(exc))
        return not self._shutdown.is_set() and self._open_source()

    def run_once(self) -> None:
        try:
            self._cycle()
            self.backoff.reset()
            self._set_healthy(True)
        except RecoverableError as exc:
            self.ownership.release_all()
            self.held.clear()
            self._set_healthy(False)
            self._back_off(type(exc).__name__, str(exc))
            if isinstance(exc, ConsumerStalled) and not self._shutdown.is_set():
                self.source.close()
                self._open_source()

    def close(self) -> None:
        self.source.close()
        self.publisher.close()
        logger.info("stopped")

    def _open_source(self) -> bool:
        while not self._shutdown.is_set():
            try:
                self.source.open()
                missing = self.source.missing_topics(self.options.topics)
                if not missing:
                    break
                logger.warning("topic(s) %s not found yet", ", ".join(missing))
                self._shutdown.wait(self.backoff.next_delay())
            except RecoverableError as exc:
                self._back_off(type(exc).__name__, str(exc))
        if self._shutdown.is_set():
            return False
        self.backoff.reset()
        self.source.subscribe(self.options.topics)
        logger.info("judging %s", ", ".join(self.options.topics))
        return True

    def _back_off(self, cause: str, fault: str) -> None:
        self.exporter.backoffs.labels(cause=cause).inc()
        delay = self.backoff.next_delay()
        logger.warning("%s; retrying in %.1fs", fault, delay)
        self._shutdown.wait(delay)

    def _set_healthy(self, healthy: bool) -> None:
        self._healthy = healthy
        self.exporter.ready.set(1 if self.ready() else 0)

    # -- the cycle ---------------------------------------------------------

    def _cycle(self) -> None:
        polled = self.source.poll(self.options.linger_ms, self.options.batch_size)
        self._follow_assignment()
        for partition, records in polled.items():
            held = self.held.get(partition)
            if held is None or not records:
                continue
            room = max(0, self.max_pending - len(held.pending))
            if room < len(records):
                # Held back behind a boundary: what does not fit is read again later.
                self.source.seek(partition, records[room].offset, self.options.start_from)
            held.pending.extend(records[:room])
            held.idle_since = None
        self._refresh_partitions()
        if not self.options.wall_clock:
            self._check_idle()
        self._step()
        self._publish()
        self._claim_pending()
        self.exporter.assigned_partitions.set(len(self.ownership))
        self.lag.report(self.ownership)

    def _follow_assignment(self) -> None:
        follow_assignment(self.ownership, self.source, self._forget)

    def _forget(self, partition: Partition) -> None:
        self.held.pop(partition, None)
        self.lag.forget(partition)

    def _claim_pending(self) -> None:
        for partition, epoch in to_claim(self.ownership, self.source, self.store.claim):
            loaded = self.store.load(partition.name)
            judge = ClickJudge.from_state(self.settings, loaded.state)
            offset = loaded.offset
            if offset is not None and offset < (start := self.source.log_start(partition)):
                # Deleted before they were read (retention): judged without them, and counted.
                self.exporter.offsets_skipped.labels(topic=partition.topic,
                                                     partition=str(partition.partition)).inc(start - offset)
                logger.warning("%s: offsets %d to %d were deleted from Kafka before they were read; their "
                               "impressions and clicks are not counted", partition.name, offset, start - 1)
                offset = start
            self.source.seek(partition, offset, self.options.start_from)
            self.ownership.claimed(partition, epoch, loaded.offset)
            self.held[partition] = _Held(judge, outbox=list(loaded.outbox))
            logger.info("claimed %s (epoch %s), resuming at offset %s with %d judgment(s) to publish", partition.name,
                        epoch, loaded.offset if loaded.offset is not None else self.options.start_from,
                        len(loaded.outbox))

    def _refresh_partitions(self) -> None:
        now = time.monotonic()
        if now >= self._partitions_due or not self._partitions:
            self._partitions = {p.name for p in self.source.partitions_of(self.options.topics)}
            self._partitions_due = now + self.PARTITIONS_CHECK_S

    def _check_idle(self) -> None:
        """Mark the partitions read to the end of their logs (nothing queued, nothing past their position)."""
        now = time.monotonic()
        if now < self._idle_due:
            return
        self._idle_due = now + self.IDLE_CHECK_S
        quiet = [p for p, held in self.held.items() if not held.pending]
        ends = self.source.stable_ends(quiet) if quiet else {}
        for partition in quiet:
            position = self.source.position(partition)
            held = self.held[partition]
            if position is not None and partition in ends and position >= ends[partition]:
                held.idle_since = held.idle_since or now
            else:
                held.idle_since = None

    def _step(self) -> None:
        started = time.perf_counter()
        commits: list[JudgeCommit] = []
        statuses: dict[str, Status] | None = None
        applied = 0

        def read_statuses() -> dict[str, Status]:
            nonlocal statuses
            if statuses is None:
                statuses = self.store.statuses(self._partitions)
            return statuses

        for partition, held in sorted(self.held.items()):
            commit, records = self._advance(partition, held, read_statuses)
            if commit is not None:
                commits.append(commit)
                applied += records
        if not commits:
            if time.monotonic() - self._last_contact > self.IDLE_STORE_CHECK_S:
                # Idle: nothing would notice a Redis outage, yet /readyz must tell it.
                self.store.check()
                self._last_contact = time.monotonic()
            return
        by_name = {p.name: p for p in self.held}
        try:
            self.store.commit(commits)
        except FencedError as exc:
            self.exporter.fenced.inc()
            logger.warning("%s", exc)
            for commit in commits:
                self.held.pop(by_name[commit.partition], None)
            self.ownership.release([by_name[c.partition] for c in commits])
            return
        self._last_contact = time.monotonic()
        for commit in commits:
            partition = by_name[commit.partition]
            self.ownership.committed(partition, commit.next_offset)
            self.held[partition].outbox.extend(commit.outbox)
        self.exporter.batch_events.observe(applied)
        self.exporter.batch_seconds.observe(time.perf_counter() - started)
        try:
            self.source.commit(self.ownership.offsets(), asynchronous=True)
        except RecoverableError as exc:
            # Kafka's committed offsets only feed lag dashboards; the store's are the truth.
            logger.info("Kafka offset commit skipped: %s", exc)

    def _advance(self, partition: Partition, held: _Held,
                 statuses: Callable[[], dict[str, Status]]) -> tuple[JudgeCommit | None, int]:
        """Decide, apply and close what the partition can now: its commit (None: nothing changed)
        and the records it applied."""
        judge = held.judge
        claim = self.ownership.claim(partition)
        # Where the commit leaves the partition if it applies nothing; known before anything changes,
        # so that a boundary closed is always committed.
        offset = claim.offset if claim.offset is not None else \
            held.pending[0].offset if held.pending else self.source.position(partition)
        if offset is None:
            return None, 0
        outbox: list[bytes] = []
        figures: dict[str, str] = {}
        prune = waiting = waiting_at(judge)
        if waiting is not None:
            ctr = decidable(waiting, self._partitions, statuses, self.store, self.settings.max_rank)
            if ctr is None:
                return None, 0
            outbox, figures = decide(judge, waiting, ctr)
        applied = 0
        closed: tuple[int, list[list[int]]] | None = None
        now_ms = int(self.clock() * 1000)
        wall = self.options.wall_clock
        if wall:
            # Passing a boundary comes first: the records read after it are taken in after it.
            boundary = judge.due(now_ms)
            if boundary is None:
                judge.advance(now_ms)
            else:
                closed = close(judge, boundary)
        while held.pending and closed is None:
            record = held.pending[0]
            event = checked_event(record, self.options.checks, now_ms)
            if isinstance(event, Impression | Click):
                boundary = None if wall else judge.due(event.ts)
                if boundary is not None:
                    closed = close(judge, boundary)
                    break
                if wall:
                    judge.take(event)
                else:
                    judge.add(event)
            elif isinstance(event, Judgment):
                judge.count(JUDGMENT)
            elif isinstance(event, InvalidEvent):
                judge.count(rejected(event.reason))
            held.pending.popleft()
            offset = record.offset + 1
            applied += 1
        if not wall and closed is None and not held.pending and waiting_at(judge) is None \
                and held.idle_since is not None and time.monotonic() - held.idle_since >= self.options.idle_ms / 1000:
            boundary = idle_boundary(partition.name, judge, statuses())
            if boundary is not None:
                logger.info("%s has had nothing to read for %s ms: it counts as past boundary %d", partition.name,
                            self.options.idle_ms, boundary)
                closed = close(judge, boundary)
        if waiting is None and closed is None and not applied:
            return None, 0
        return JudgeCommit(partition.name, claim.epoch, judge.changes(), offset, claim.offset, outbox, closed,
                           prune, figures), applied

    def _publish(self) -> None:
        for partition, held in sorted(self.held.items()):
            if not held.outbox:
                continue
            self.publisher.publish(partition, held.outbox)
            sent = len(held.outbox)
            try:
                self.store.published(partition.name, self.ownership.claim(partition).epoch, sent)
            except FencedError as exc:
                self.exporter.fenced.inc()
                logger.warning("%s", exc)
                self.held.pop(partition, None)
                self.ownership.release([partition])
                continue
            held.outbox.clear()
            self.exporter.judgments_published.inc(sent)
