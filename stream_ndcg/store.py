"""The state store: the protocol every store meets, and its in-memory twin.

A store keeps, per partition (a topic and partition of the input, named
``"topic:partition"``), the query states, the impression ids already applied,
the event clock and the next offset to consume; and, across partitions, the
aggregate sums and the event counts. `commit` writes one batch's changes and
its next offset in one atomic step, so a batch is applied entirely or not at
all, and a store's offsets say exactly which events its state contains.

Fencing: `claim` hands out a new epoch (a token never given before) for a
partition, and `commit` refuses (raises `FencedError`) a write carrying any
other, so an instance that
lost a partition in a rebalance can no longer change it; and a write whose
`expected_offset` is not the stored one (another writer went on, or Redis came
back from its append-only file a second behind), so that the writer re-reads
the stored offset and resumes from there.
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from stream_ndcg.drilldown import Row
from stream_ndcg.engine import BatchOutcome, QueryState
from stream_ndcg.errors import FencedError
from stream_ndcg.reconfigure import decide
from stream_ndcg.state_format import FORMAT_VERSION, check_format, state_fields, state_from_fields
from stream_ndcg.vocabulary import AggregateKey
from stream_ndcg.windows import oldest_kept_bucket


@dataclass
class Snapshot:
    """What a batch needs of one partition before the engine runs."""

    states: dict[str, QueryState]
    # The impression ids the store remembers, with the bucket each is remembered from.
    known_impressions: dict[str, int]
    clock_ms: int | None


@dataclass
class RowRead:
    """The drill-down rows a store gives a reader of one partition (see `drilldown.QueryIndex`)."""

    # Where the next read goes on from.
    cursor: str | None
    # True: `rows` are all the rows held (the reader was too far behind, or new), so forget the
    # partition's rows first; False: the rows written since the cursor (some perhaps again).
    whole: bool
    # (bucket, segment, query id, row)
    rows: list[tuple[int, str, str, Row]]


@dataclass
class AggregateRead:
    """What a scrape reads of one partition's aggregate sums (see `window_sums.WindowSums`)."""

    partition: str
    # Where the next read goes on from; None: read the partition whole next time.
    mark: str | None
    # True: `buckets` are all the partition's buckets from the `since_bucket` asked for on, so
    # forget what was held of it; False: the buckets changed since the mark (some perhaps again).
    whole: bool
    # bucket -> (segment key, field) -> sum
    buckets: dict[int, dict[tuple[str, str], float]]


@dataclass(frozen=True)
class Commit:
    """One batch of one partition, ready to be written."""

    partition: str
    epoch: str
    outcome: BatchOutcome
    next_offset: int
    expected_offset: int | None


class CommitInFlight(Protocol):
    """A commit sent to the store, its reply not yet read (`StateStore.begin_commit`)."""

    def finish(self) -> float:
        """Wait for the reply, and return when it came (`time.monotonic()`); FencedError or
        StoreUnavailable, as `commit` raises them."""
        ...


@dataclass(frozen=True)
class DeferredCommit:
    """`begin_commit` of a store with no round trip to overlap: it writes when finished."""

    write: Callable[[], None]

    def finish(self) -> float:
        self.write()
        return time.monotonic()


class StateStore(Protocol):
    """Where the service keeps everything; the in-memory and Redis stores meet one contract."""

    def claim(self, partition: str) -> str:
        """Take over a partition: a new epoch, which fences every earlier holder."""
        ...

    def next_offset(self, partition: str) -> int | None:
        """The next offset to consume for a partition, None if it was never committed."""
        ...

    def load(self, partition: str, query_ids: Collection[str], impressions: Mapping[str, int]) -> Snapshot:
        """The states of `query_ids`, and which of `impressions` (id -> time bucket) were already
        applied, by id, with the bucket of the earlier one: ids are remembered for the dedup
        horizon at least (the engine decides which still count as duplicates)."""
        ...

    def commit(self, commits: Collection[Commit]) -> None:
        """Write each partition's batch and next offset atomically; FencedError if an epoch is
        stale or the stored offset is not the expected one."""
        ...

    def begin_commit(self, commits: Collection[Commit]) -> CommitInFlight:
        """`commit`, its reply read by `finish()`: the caller may fetch the next batch meanwhile.
        Until it is finished the store may or may not have written it, so nothing else of these
        partitions is loaded or committed. StoreUnavailable here if it cannot even be sent."""
        ...

    def ranked_lists(self, partition: str, query_id: str) -> dict[tuple[int, str, tuple[str, ...]], int]:
        """The distinct ranked lists of a query held in the horizon: (bucket, segment, list) -> impressions."""
        ...

    def read_rows(self, partition: str, cursor: str | None, since_bucket: int) -> RowRead:
        """The drill-down rows of a partition written after `cursor`; all of them from `since_bucket`
        on when `cursor` is None or too old to read on from."""
        ...

    def partitions(self) -> list[str]:
        """Every partition ever claimed."""
        ...

    def aggregates(self, since_bucket: int | None = None) -> dict[AggregateKey, float]:
        """The aggregate sums of every partition from `since_bucket` on, added up."""
        ...

    def read_aggregates(self, marks: Mapping[str, str], since_bucket: int) -> Iterator[AggregateRead]:
        """Every partition's aggregate sums from `since_bucket` on: of a partition with a mark in
        `marks`, the buckets written since it; of any other (or one whose mark the store cannot
        read on from), all of them. Read as it is iterated, a few partitions at a time (a whole
        read of a day of minutes is millions of sums); each mark is read before its buckets."""
        ...

    def counts(self) -> Counter[str]:
        ...

    def clock_ms(self) -> int | None:
        """The greatest clock any partition committed (event time with the event clock)."""
        ...

    def admit(self, label: str, value: str, cap: int) -> bool:
        """Whether `value` may be a value of segment label `label`: one of the first `cap` seen."""
        ...

    def check(self) -> None:
        """Raise StoreUnavailable if the store cannot be reached."""
        ...

    def adopt(self, config: Mapping[str, object], *, rebuild: bool = False) -> bool:
        """Build on state made with `config` (what the numbers mean: cut-offs, gain, ideal...,
        `reconfigure.configured`).

        The first start records it. A later start with another one is judged by
        `reconfigure.decide`: a change the state can serve is recorded and applied in place; one
        it cannot raises ConfigError saying which settings need a rebuild and why, unless
        `rebuild`: then `config` is recorded instead and the store starts afresh (a new generation
        of keys, with no offsets: consume from the beginning). True if it did. State stored in
        another `state_format.FORMAT_VERSION` is refused (ConfigError), rebuild or not; state with
        none recorded is version 1, and this one is recorded.
        """
        ...

    def recorded_config(self) -> tuple[dict[str, object] | None, str | None]:
        """The metric configuration recorded with the state (None: none yet) and its format version."""
        ...

    def follow(self) -> bool:
        """For a reader that never adopts: read the newest generation of the state (the one the
        last rebuild started); True if it is not the one read before."""
        ...


@dataclass
class _Partition:
    epoch: str = ""
    next_offset: int | None = None
    clock_ms: int | None = None
    states: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    lists: dict[str, dict[tuple[int, str, tuple[str, ...]], int]] = field(default_factory=dict)
    impressions: dict[str, int] = field(default_factory=dict)
    rows: dict[int, dict[tuple[str, str], Row]] = field(default_factory=dict)
    # bucket -> (segment key, field) -> sum, and the next offset of the commit that last changed each bucket.
    aggregates: dict[int, dict[tuple[str, str], float]] = field(default_factory=dict)
    changed: dict[int, int] = field(default_factory=dict)
    # The rows of each commit, in order: a cursor is a position in it.
    row_log: list[list[tuple[int, str, str, Row]]] = field(default_factory=list)


class MemoryStore:
    """The in-memory twin of the Redis store, for the offline paths and the tests.

    States are kept serialised, in the hash fields Redis keeps them in, so that
    a loaded state is never the engine's own object and a test through this
    store exercises the same round trip.
    """

    def __init__(self, *, bucket_ms: int = 60_000, horizon_ms: int | None = None,
                 dedup_horizon_ms: int | None = None) -> None:
        self.bucket_ms = bucket_ms
        self.horizon_ms = horizon_ms
        # Impression ids are forgotten behind this (None: the horizon).
        self.dedup_horizon_ms = dedup_horizon_ms
        self._partitions: dict[str, _Partition] = {}
        self._counts: Counter[str] = Counter()
        self._segment_values: dict[str, set[str]] = {}
        self._claims = 0
        self._config: dict[str, object] | None = None
        # The format version recorded with the state, as Redis records it: None until the first adopt.
        self.format_version: str | None = None
        # How many times the state was rebuilt: a mark of an earlier generation is not read on from.
        self._generation = 0

    def adopt(self, config: Mapping[str, object], *, rebuild: bool = False) -> bool:
        check_format(self.format_version)
        self.format_version = str(FORMAT_VERSION)
        record, rebuilt = decide(self._config, config, rebuild=rebuild)
        if record is not None:
            self._config = record
        if not rebuilt:
            return False
        self._partitions.clear()
        self._counts.clear()
        self._segment_values.clear()
        self._generation += 1
        return True

    def recorded_config(self) -> tuple[dict[str, object] | None, str | None]:
        return (None if self._config is None else dict(self._config)), self.format_version

    def follow(self) -> bool:
        """One object holds every generation's state: there is nothing to move to."""
        return False

    def _partition(self, name: str) -> _Partition:
        return self._partitions.setdefault(name, _Partition())

    def claim(self, partition: str) -> str:
        part = self._partition(partition)
        self._claims += 1
        part.epoch = f"claim-{self._claims}"
        return part.epoch

    def next_offset(self, partition: str) -> int | None:
        return self._partition(partition).next_offset

    def load(self, partition: str, query_ids: Collection[str], impressions: Mapping[str, int]) -> Snapshot:
        part = self._partition(partition)
        states = {q: state_from_fields(part.states[q]) for q in query_ids if q in part.states}
        known = {i: part.impressions[i] for i in impressions if i in part.impressions}
        return Snapshot(states, known, part.clock_ms)

    def begin_commit(self, commits: Collection[Commit]) -> CommitInFlight:
        return DeferredCommit(functools.partial(self.commit, commits))

    def commit(self, commits: Collection[Commit]) -> None:
        for commit in commits:
            part = self._partition(commit.partition)
            if commit.epoch != part.epoch:
                raise FencedError(f"partition {commit.partition} was claimed by a newer holder")
            if commit.expected_offset != part.next_offset:
                raise FencedError(f"partition {commit.partition} is at offset {part.next_offset}, "
                                  f"not {commit.expected_offset}")
        for commit in commits:
            part = self._partition(commit.partition)
            outcome = commit.outcome
            for query_id, state in outcome.touched.items():
                part.states[query_id] = state_fields(state)
            part.impressions.update(outcome.impression_buckets)
            for (query_id, bucket, segment, ranked), count in outcome.lists.items():
                held = part.lists.setdefault(query_id, {})
                held[(bucket, segment, ranked)] = held.get((bucket, segment, ranked), 0) + count
            for (bucket, segment, name), change in outcome.aggregates.items():
                sums = part.aggregates.setdefault(bucket, {})
                sums[(segment, name)] = sums.get((segment, name), 0.0) + change
                part.changed[bucket] = commit.next_offset
            written = [(bucket, segment, query_id, row) for (query_id, bucket, segment), row in outcome.rows.items()]
            for bucket, segment, query_id, row in written:
                part.rows.setdefault(bucket, {})[(segment, query_id)] = row
            part.row_log.append(written)
            self._counts.update(outcome.counts)
            part.next_offset = commit.next_offset
            if outcome.clock_ms is not None:
                part.clock_ms = max(part.clock_ms or outcome.clock_ms, outcome.clock_ms)
            self._expire(part)

    def _expire(self, part: _Partition) -> None:
        if part.clock_ms is None:
            return
        dedup_horizon_ms = self.dedup_horizon_ms or self.horizon_ms
        if dedup_horizon_ms is not None:
            remembered = oldest_kept_bucket(part.clock_ms, dedup_horizon_ms, self.bucket_ms)
            part.impressions = {i: bucket for i, bucket in part.impressions.items() if bucket >= remembered}
        if self.horizon_ms is None:
            return
        oldest = oldest_kept_bucket(part.clock_ms, self.horizon_ms, self.bucket_ms)
        for held in part.lists.values():
            for stale in [listed for listed in held if listed[0] < oldest]:
                del held[stale]
        for bucket in [bucket for bucket in part.aggregates if bucket < oldest]:
            del part.aggregates[bucket], part.changed[bucket]
        for bucket in [bucket for bucket in part.rows if bucket < oldest]:
            del part.rows[bucket]

    def read_rows(self, partition: str, cursor: str | None, since_bucket: int) -> RowRead:
        part = self._partition(partition)
        if cursor is None:
            rows = [(bucket, segment, query_id, row) for bucket, held in part.rows.items() if bucket >= since_bucket
                    for (segment, query_id), row in held.items()]
            return RowRead(str(len(part.row_log)), True, rows)
        return RowRead(str(len(part.row_log)), False,
                       [row for written in part.row_log[int(cursor):] for row in written])

    def partitions(self) -> list[str]:
        return sorted(self._partitions)

    def aggregates(self, since_bucket: int | None = None) -> dict[AggregateKey, float]:
        parts: dict[AggregateKey, list[float]] = {}
        for part in self._partitions.values():
            for bucket, sums in part.aggregates.items():
                if since_bucket is None or bucket >= since_bucket:
                    for (segment, name), value in sums.items():
                        parts.setdefault((bucket, segment, name), []).append(value)
        return {key: math.fsum(values) for key, values in parts.items()}

    def read_aggregates(self, marks: Mapping[str, str], since_bucket: int) -> Iterator[AggregateRead]:
        for name, part in sorted(self._partitions.items()):
            generation, _, offset = marks.get(name, "").partition("/")
            whole = not offset or int(generation) != self._generation
            buckets = {bucket: dict(sums) for bucket, sums in part.aggregates.items()
                       if bucket >= since_bucket and (whole or part.changed[bucket] > int(offset))}
            mark = f"{self._generation}/{part.next_offset if part.next_offset is not None else -1}"
            yield AggregateRead(name, mark, whole, buckets)

    def counts(self) -> Counter[str]:
        return Counter(self._counts)

    def clock_ms(self) -> int | None:
        clocks = [p.clock_ms for p in self._partitions.values() if p.clock_ms is not None]
        return max(clocks) if clocks else None

    def admit(self, label: str, value: str, cap: int) -> bool:
        values = self._segment_values.setdefault(label, set())
        if value not in values and len(values) < cap:
            values.add(value)
        return value in values

    def ranked_lists(self, partition: str, query_id: str) -> dict[tuple[int, str, tuple[str, ...]], int]:
        return dict(self._partition(partition).lists.get(query_id, {}))

    def check(self) -> None:
        """Always reachable."""
