"""One batch, from records to a committed state: parse, check, project, load, apply, commit.

The processor, the tests and the bench all run batches through `BatchPipeline`,
so there is one way to turn events into stored state. It knows nothing of
Kafka: records are anything with topic, partition, offset, key and value.

    pipeline = BatchPipeline(store, engine, RecordChecks(require_key=False))
    pipeline.apply("events:0", epoch, [parse_event(raw) for raw in lines], next_offset=len(lines),
                   expected_offset=None)
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from stream_ndcg.dead_letters import DeadLetters
from stream_ndcg.engine import Engine
from stream_ndcg.events import DEFAULT_LIMITS, Click, Event, Impression, InvalidEvent, Judgment, Limits, parse_event
from stream_ndcg.experiments import Experiment, cell_changes
from stream_ndcg.segments import SegmentProjector
from stream_ndcg.source.base import Record
from stream_ndcg.state.base import Commit, CommitInFlight, DeferredCommit, StateStore


@dataclass(frozen=True)
class RecordChecks:
    """The contract's limits, plus what only the service can check: the key and the wall clock."""

    limits: Limits = DEFAULT_LIMITS
    require_key: bool = True
    # How far ahead of the wall clock an event's time may be (ms); None: no limit.
    max_future_ms: int | None = None


def checked_event(record: Record, checks: RecordChecks, now_ms: int) -> Event | InvalidEvent:
    """A record's event, or why it is rejected: the contract's checks, the key and the wall clock."""
    event = parse_event(record.value, checks.limits)
    if isinstance(event, InvalidEvent):
        return event
    if checks.require_key and not record.key:
        return InvalidEvent("missing_key", "messages must be keyed by query_id")
    if checks.max_future_ms is not None and event.ts > now_ms + checks.max_future_ms:
        return InvalidEvent("ts_in_future", f"ts {event.ts} is more than {checks.max_future_ms} ms ahead")
    return event


@dataclass(frozen=True)
class PartitionBatch:
    """What a batch holds for one partition, and where its commit must start and end."""

    partition: str
    epoch: str
    records: Sequence[Record]
    expected_offset: int | None

    @property
    def next_offset(self) -> int:
        return self.records[-1].offset + 1


@dataclass
class BatchResult:
    commits: list[Commit] = field(default_factory=list)
    # Event times of the judgments committed, for the judgment-to-metric latency.
    judgment_times: list[int] = field(default_factory=list)
    records: int = 0


class BatchPipeline:
    """Turns records into state changes and commits them, all partitions of a batch at once.

    The order within a batch (the consumer's docstring gives the whole commit order):
    parse every record (a bad one becomes a counted rejection and, with a dead-letter
    topic, goes there, acknowledged before anything is committed); load the touched
    query states and the already-applied impression ids; apply the events with the
    engine; write each partition's changes with its next offset in one atomic step.
    """

    def __init__(self, store: StateStore, engine: Engine, checks: RecordChecks = RecordChecks(), *,
                 event_clock: bool = False, projector: SegmentProjector | None = None,
                 dead_letters: DeadLetters | None = None, experiments: Sequence[Experiment] = ()) -> None:
        self.store = store
        self.engine = engine
        self.checks = checks
        self.event_clock = event_clock
        self.projector = projector
        self.dead_letters = dead_letters
        # Their cells take each batch's credits by query, which the engine reports when asked.
        self.experiments = tuple(experiments)
        if self.experiments and not engine.query_credits:
            raise ValueError("experiments need an engine that reports its credits by query (query_credits=True)")

    def run(self, batches: Collection[PartitionBatch], now_ms: int) -> BatchResult:
        """Process and commit a batch; FencedError (nothing written) if a partition is no longer ours."""
        result = self.staged(batches, now_ms)
        self.store.commit(result.commits)
        return result

    def send(self, batches: Collection[PartitionBatch], now_ms: int, *,
             overlap: bool = True) -> tuple[BatchResult, CommitInFlight]:
        """`run`, its commit's reply left to read: sent now (`StateStore.begin_commit`), or without
        `overlap` sent and answered when finished (`StateStore.commit`)."""
        result = self.staged(batches, now_ms)
        if overlap:
            return result, self.store.begin_commit(result.commits)
        return result, DeferredCommit(functools.partial(self.store.commit, result.commits))

    def staged(self, batches: Collection[PartitionBatch], now_ms: int) -> BatchResult:
        """A batch's records parsed and applied: its commits, not yet written."""
        parsed = {batch.partition: [self.parse(record, now_ms) for record in batch.records] for batch in batches}
        if self.dead_letters is not None:
            for batch in batches:
                for record, event in zip(batch.records, parsed[batch.partition], strict=True):
                    if isinstance(event, InvalidEvent):
                        self.dead_letters.send(record, event.reason)
            # Before the commit: a rejected message is in the dead-letter topic before its
            # offset counts as consumed (at least once there; a crash may send it twice).
            self.dead_letters.flush()
        result = BatchResult()
        for batch in batches:
            events = parsed[batch.partition]
            result.commits.append(self.stage(batch.partition, batch.epoch, events, batch.next_offset,
                                             batch.expected_offset, now_ms))
            result.judgment_times.extend(e.ts for e in events if isinstance(e, Judgment))
            result.records += len(batch.records)
        return result

    def parse(self, record: Record, now_ms: int) -> Event | InvalidEvent:
        event = checked_event(record, self.checks, now_ms)
        if isinstance(event, Impression) and self.projector is not None:
            return self.projector.project(event)
        return event

    def stage(self, partition: str, epoch: str, events: Sequence[Event | InvalidEvent], next_offset: int,
              expected_offset: int | None, now_ms: int | None) -> Commit:
        """Load what the events touch and apply them: the commit, not yet written. With the event
        clock the engine's clock goes on from the partition's stored one; `now_ms` is the wall
        clock otherwise (None: no expiry and no too-old rejections)."""
        # A click is only counted (`Engine.apply`): no state of its query is loaded for it.
        valid = [e for e in events if not isinstance(e, InvalidEvent | Click)]
        snapshot = self.store.load(
            partition,
            {e.query_id for e in valid},
            {e.impression_id: self.engine.bucket_of(e.ts) for e in valid if isinstance(e, Impression)},
        )
        clock = snapshot.clock_ms if self.event_clock else now_ms
        outcome = self.engine.apply(events, snapshot.states, snapshot.known_impressions, clock,
                                    event_clock=self.event_clock)
        cells = cell_changes(outcome.query_credits, self.experiments, self.engine.bucket_ms) if self.experiments else {}
        return Commit(partition, epoch, outcome, next_offset, expected_offset, cells)

    def move_offsets(self, moves: Mapping[str, tuple[str, int, int | None]], now_ms: int) -> None:
        """Commit offsets without records: partition -> (epoch, next offset, expected offset)."""
        self.store.commit([self.stage(partition, epoch, [], next_offset, expected, now_ms)
                           for partition, (epoch, next_offset, expected) in moves.items()])

    def apply(self, partition: str, epoch: str, events: Sequence[Event | InvalidEvent], next_offset: int,
              expected_offset: int | None, now_ms: int | None = None) -> Commit:
        """Stage and commit one partition's parsed events (the tests' and the bench's entry)."""
        commit = self.stage(partition, epoch, events, next_offset, expected_offset, now_ms)
        self.store.commit([commit])
        return commit

