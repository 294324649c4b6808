"""The state store's protocol: what every store meets (`state.memory`, `state.redis`).

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

A commit also adds the batch's changes to the experiments' cells (`experiments`), kept apart from
the buckets. For each experiment a partition marks, at its first commit that names it, the first
bucket it counts: the experiment's first, or the bucket after the partition's clock if the
partition already had one (the state then holds groups the experiment never saw credited, and a
later re-credit of one would add a difference without its base). The changes of earlier buckets
are left out.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from stream_ndcg.engine import BatchOutcome
from stream_ndcg.experiments import CellChanges, Cells
from stream_ndcg.query_state import QueryState
from stream_ndcg.rows import Row
from stream_ndcg.vocabulary import AggregateKey
from stream_ndcg.window_sums import AggregateRead


@dataclass
class Snapshot:
    """What a batch needs of one partition before the engine runs."""

    states: dict[str, QueryState]
    # The impression ids the store remembers, with the bucket each is remembered from.
    known_impressions: dict[str, int]
    clock_ms: int | None


@dataclass
class RowRead:
    """The drill-down rows a store gives a reader of one partition (see `drilldown.index.QueryIndex`)."""

    # Where the next read goes on from.
    cursor: str | None
    # True: `rows` are all the rows held (the reader was too far behind, or new), so forget the
    # partition's rows first; False: the rows written since the cursor, each once (the last written
    # of it: rows are absolute), some perhaps read before.
    whole: bool
    # (bucket, segment, query id, row)
    rows: list[tuple[int, str, str, Row]]


@dataclass(frozen=True)
class Commit:
    """One batch of one partition, ready to be written."""

    partition: str
    epoch: str
    outcome: BatchOutcome
    next_offset: int
    expected_offset: int | None
    # The experiments' cell changes (`experiments.cell_changes`): an entry for every experiment
    # registered, so that the store marks the first bucket each counts.
    experiments: CellChanges = field(default_factory=dict)


@dataclass
class ExperimentRead:
    """An experiment's cells as a store holds them, added up over the partitions."""

    cells: Cells
    # partition -> the first bucket it counts (the start's, or the one after its clock when the
    # experiment was registered on state it already had).
    first_buckets: dict[str, int]


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

    def read_all_rows(self, cursors: Mapping[str, str | None], since_bucket: int) -> dict[str, RowRead]:
        """`read_rows` of every partition, each on from its cursor in `cursors` (none: whole), read
        together (the Redis store: the logs of all partitions with a cursor in one round trip)."""
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

    def experiment(self, name: str) -> ExperimentRead:
        """An experiment's cells, summed over every partition (empty if none holds it)."""
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


