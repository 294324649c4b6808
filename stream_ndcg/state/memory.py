"""The in-memory twin of the Redis store, for the offline paths and the tests; the same contract
(`state.base.StateStore`), tested by the same suite."""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

from stream_ndcg.errors import FencedError
from stream_ndcg.experiments import CellChanges, Cells
from stream_ndcg.reconfigure import decide
from stream_ndcg.rows import Row
from stream_ndcg.state.base import Commit, CommitInFlight, DeferredCommit, ExperimentRead, RowRead, Snapshot
from stream_ndcg.state.format import FORMAT_VERSION, check_format, state_fields, state_from_fields
from stream_ndcg.vocabulary import AggregateKey
from stream_ndcg.window_sums import AggregateRead
from stream_ndcg.windows import oldest_kept_bucket


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
    # experiment name -> (the first bucket it counts, its cells): kept as long as the store lives.
    experiments: dict[str, tuple[int, Cells]] = field(default_factory=dict)


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
        # A group of the pool ideal is stored without its lists: they are its bucket's, as in Redis.
        for query_id, state in states.items():
            for (bucket, segment), group in state.groups.items():
                if not group.lists_stored:
                    group.lists = {ranked: count for (b, s, ranked), count in part.lists.get(query_id, {}).items()
                                   if b == bucket and s == segment}
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
            self._add_cells(part, commit.experiments)
            part.next_offset = commit.next_offset
            if outcome.clock_ms is not None:
                part.clock_ms = max(part.clock_ms or outcome.clock_ms, outcome.clock_ms)
            self._expire(part)

    def _add_cells(self, part: _Partition, experiments: CellChanges) -> None:
        """The experiments' changes, from the bucket each partition marks (`state.base`); before the
        clock moves on."""
        for name, (first_bucket, changes) in experiments.items():
            held = part.experiments.get(name)
            if held is None:
                mark = first_bucket if part.clock_ms is None else max(first_bucket, part.clock_ms // self.bucket_ms + 1)
                held = part.experiments[name] = (mark, {})
            mark, cells = held
            for (bucket, arm, query_id, figure), change in changes.items():
                if bucket >= mark:
                    key = (arm, query_id, figure)
                    cells[key] = cells.get(key, 0.0) + change

    def experiment(self, name: str) -> ExperimentRead:
        parts: dict[tuple[str, str, str], list[float]] = {}
        first_buckets: dict[str, int] = {}
        for partition, part in sorted(self._partitions.items()):
            held = part.experiments.get(name)
            if held is not None:
                first_buckets[partition] = held[0]
                for key, value in held[1].items():
                    parts.setdefault(key, []).append(value)
        return ExperimentRead({key: math.fsum(values) for key, values in parts.items()}, first_buckets)

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
        # Each row once, the last written of it, as the Redis store reads its log (`redis_rows.rows_after`).
        latest = {(bucket, segment, query_id): row for written in part.row_log[int(cursor):]
                  for bucket, segment, query_id, row in written}
        return RowRead(str(len(part.row_log)), False,
                       [(bucket, segment, query_id, row) for (bucket, segment, query_id), row in latest.items()])

    def read_all_rows(self, cursors: Mapping[str, str | None], since_bucket: int) -> dict[str, RowRead]:
        return {partition: self.read_rows(partition, cursors.get(partition), since_bucket)
                for partition in self.partitions()}

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
