"""The judge's store: what every judge store meets (`MemoryJudgeStore` here, `state.judge_redis`).

Per input partition it keeps the click judge's state (`click_state`, in the stored form of
`state.judge_format`), the next offset to consume, the judgments decided and not yet known to be
published (the outbox), and the rank counts the partition had when it closed each boundary that
is not decided everywhere yet (COEC's CTR is summed over every partition's). `commit` writes one
batch's changes, its next offset, the judgments it decided and the rank counts of the boundary it
closed in one atomic step, refused (`FencedError`) if the partition's epoch is no longer the
writer's or the stored offset is not the one it expects, as `state.base.StateStore.commit` is.
`published` drops judgments from the front of the outbox once the brokers have them, fenced too.

    store = MemoryJudgeStore()
    epoch = store.claim("events:0")
    store.commit([JudgeCommit("events:0", epoch, judge.changes(), next_offset=10, expected_offset=None)])
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from stream_ndcg.click_state import JudgeState, Pair
from stream_ndcg.errors import FencedError
from stream_ndcg.state import judge_format
from stream_ndcg.state.judge_format import HashWrites


class Loaded(NamedTuple):
    """A partition as its new holder reads it."""

    state: JudgeState
    # The next offset to consume (None: never committed).
    offset: int | None
    # Judgments decided and not known to be published, oldest first.
    outbox: list[bytes]


class Status(NamedTuple):
    """How far a partition is, as the others read it: its clock and the last boundary it closed."""

    clock: int | None
    closed: int | None

    @property
    def waiting(self) -> int | None:
        """The boundary it closed and waits at (its clock not yet there), None if none."""
        return self.closed if self.closed is not None and (self.clock is None or self.clock < self.closed) else None

    def past(self, boundary: int) -> bool:
        """Whether it closed `boundary` (or a later one), or its clock is at or past it: a partition
        whose clock started past a boundary passes it without closing it."""
        return any(mark is not None and mark >= boundary for mark in (self.closed, self.clock))


@dataclass(frozen=True)
class JudgeCommit:
    """One partition's batch, ready to be written."""

    partition: str
    epoch: str
    changes: JudgeState
    next_offset: int
    expected_offset: int | None
    # Judgment events decided by the batch, as published (JSON), appended to the outbox.
    outbox: list[bytes] = field(default_factory=list)
    # The boundary closed by the batch, and the partition's rank counts over its horizon then.
    closed_ranks: tuple[int, list[list[int]]] | None = None
    # Rank counts of boundaries before this one are dropped: every partition has decided them.
    prune_before: int | None = None
    # Figures for the exporter, kept with the meta fields: name -> text.
    figures: dict[str, str] = field(default_factory=dict)


class Given(NamedTuple):
    """A pair's grade as the judge last published it: at boundary `ts`, with its evidence."""

    grade: float
    ts: int
    evidence: dict[str, int | float]


def given_of(graded: Mapping[Pair, list[Any]]) -> dict[Pair, Given]:
    return {pair: Given(*value) for pair, value in graded.items()}


class JudgeStore(Protocol):
    def adopt(self) -> None:
        """Check the judge state's format version, or record it; ConfigError if it cannot be read."""
        ...

    def claim(self, partition: str) -> str:
        """Take over a partition: a new epoch, which fences every earlier holder."""
        ...

    def load(self, partition: str) -> Loaded:
        """The partition's judge state, next offset and outbox."""
        ...

    def commit(self, commits: Collection[JudgeCommit]) -> None:
        """Write each partition's batch atomically; FencedError names those refused."""
        ...

    def published(self, partition: str, epoch: str, count: int) -> None:
        """Drop the first `count` judgments of the outbox: the brokers have them. FencedError if
        the epoch is no longer the partition's."""
        ...

    def statuses(self, partitions: Collection[str]) -> dict[str, Status]:
        """Each partition's clock and last boundary closed (both None for one never committed)."""
        ...

    def closed_ranks(self, partitions: Collection[str], boundary: int) -> dict[str, list[list[int]] | None]:
        """Each partition's rank counts when it closed `boundary` (None: not closed, or pruned)."""
        ...

    def figures(self) -> dict[str, dict[str, str]]:
        """Every partition ever claimed, with its meta fields (the exporter's figures among them)."""
        ...

    def check(self) -> None:
        """Raise StoreUnavailable if the store cannot be reached."""
        ...

    def recorded_format(self) -> str | None:
        """The judge state's format version as recorded (None: no judge ever adopted the store); read only."""
        ...

    def partitions(self) -> list[str]:
        """Every partition ever claimed, sorted."""
        ...

    def graded(self, partition: str, pairs: Collection[Pair] | None = None) -> dict[Pair, Given]:
        """The partition's pairs holding a grade (all, or those of `pairs`), as last published."""
        ...


def ranks_text(ranks: list[list[int]]) -> str:
    return f"{','.join(map(str, ranks[0]))}|{','.join(map(str, ranks[1]))}"


def ranks_of_text(text: str) -> list[list[int]]:
    shown, clicked = text.split("|")
    return [[int(n) for n in shown.split(",")], [int(n) for n in clicked.split(",")]]


@dataclass
class _Partition:
    epoch: str = ""
    offset: int | None = None
    hashes: dict[str, dict[str, str]] = field(default_factory=dict)
    outbox: list[bytes] = field(default_factory=list)
    ranks: dict[int, str] = field(default_factory=dict)
    figures: dict[str, str] = field(default_factory=dict)


class MemoryJudgeStore:
    """The `JudgeStore` in memory, for tests: the same stored form as Redis's."""

    def __init__(self) -> None:
        self._partitions: dict[str, _Partition] = {}
        self._epochs = 0
        self.format: str | None = None

    def adopt(self) -> None:
        judge_format.check_judge_format(self.format)
        self.format = str(judge_format.JUDGE_FORMAT_VERSION)

    def claim(self, partition: str) -> str:
        self._epochs += 1
        held = self._partitions.setdefault(partition, _Partition())
        held.epoch = f"epoch-{self._epochs}"
        return held.epoch

    def load(self, partition: str) -> Loaded:
        held = self._partitions.get(partition, _Partition())
        return Loaded(judge_format.state_of_fields(held.hashes), held.offset, list(held.outbox))

    def commit(self, commits: Collection[JudgeCommit]) -> None:
        refused = [f"{c.partition} ({reason})" for c in commits if (reason := self._refusal(c)) is not None]
        if refused:
            raise FencedError(f"batch not written for partition(s) {', '.join(refused)}")
        for commit in commits:
            held = self._partitions[commit.partition]
            _apply(held.hashes, judge_format.writes(commit.changes))
            held.offset = commit.next_offset
            held.outbox.extend(commit.outbox)
            if commit.closed_ranks is not None:
                held.ranks[commit.closed_ranks[0]] = ranks_text(commit.closed_ranks[1])
            if commit.prune_before is not None:
                held.ranks = {b: r for b, r in held.ranks.items() if b >= commit.prune_before}
            held.figures.update(commit.figures)

    def _refusal(self, commit: JudgeCommit) -> str | None:
        held = self._partitions.get(commit.partition)
        if held is None or held.epoch != commit.epoch:
            return "claimed by a newer holder"
        if held.offset != commit.expected_offset:
            return "not at the expected offset"
        return None

    def published(self, partition: str, epoch: str, count: int) -> None:
        held = self._partitions.get(partition)
        if held is None or held.epoch != epoch:
            raise FencedError(f"outbox of {partition} not trimmed: claimed by a newer holder")
        del held.outbox[:count]

    def statuses(self, partitions: Collection[str]) -> dict[str, Status]:
        return {p: status_of_meta(self._partitions[p].hashes.get("meta", {}) if p in self._partitions else {})
                for p in partitions}

    def closed_ranks(self, partitions: Collection[str], boundary: int) -> dict[str, list[list[int]] | None]:
        found = {p: self._partitions[p].ranks.get(boundary) if p in self._partitions else None for p in partitions}
        return {p: None if text is None else ranks_of_text(text) for p, text in found.items()}

    def figures(self) -> dict[str, dict[str, str]]:
        return {p: {**held.hashes.get("meta", {}), **held.figures,
                    **({"offset": str(held.offset)} if held.offset is not None else {})}
                for p, held in self._partitions.items()}

    def check(self) -> None:
        return None

    def recorded_format(self) -> str | None:
        return self.format

    def partitions(self) -> list[str]:
        return sorted(self._partitions)

    def graded(self, partition: str, pairs: Collection[Pair] | None = None) -> dict[Pair, Given]:
        held = self._partitions.get(partition, _Partition()).hashes.get("graded", {})
        if pairs is not None:
            held = {key: held[key] for key in map(judge_format.pair_field, pairs) if key in held}
        return given_of(judge_format.graded_of_fields(held))


def status_of_meta(meta: Mapping[Any, Any]) -> Status:
    """A partition's status from its meta fields (text or bytes, as Redis gives them)."""
    def number(name: str) -> int | None:
        value = meta.get(name, meta.get(name.encode()))
        text = value.decode() if isinstance(value, bytes) else value
        return int(text) if text else None

    return Status(number("clock"), number("closed"))


def _apply(hashes: dict[str, dict[str, str]], writes: HashWrites) -> None:
    for name in writes.dropped:
        hashes.pop(name, None)
    for name, keys in writes.removed.items():
        for key in keys:
            hashes.get(name, {}).pop(key, None)
    for name, values in writes.set.items():
        hashes.setdefault(name, {}).update(values)
    for name in [n for n, fields in hashes.items() if not fields]:
        del hashes[name]
