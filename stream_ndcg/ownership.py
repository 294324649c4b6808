"""Which input partitions this instance may write, with what epoch, from which offset.

A small state machine, free of Kafka and Redis, that the processor drives:

    assigned by the group --> unclaimed --claim--> owned (epoch, offset)
                                  |  ^               |
                                  |  +-- release ----+   fenced, or any store failure
                                  +----- halt -----> halted   records lost, and the
                                                              operator must decide
    revoked or no longer assigned: forgotten from any state

Only an owned partition's records are processed: records of an unclaimed one are
dropped, to be read again from the stored offset once it is claimed. A claim
takes a new epoch from the store (fencing every earlier holder) and the stored
offset, which is where reading resumes and what the next commit must find.

    ownership = Ownership()
    gone, new = ownership.sync(assignment={p0, p1}, revoked=set())
    for partition in ownership.pending():
        ownership.claimed(partition, store.claim(partition.name), store.next_offset(partition.name))

`follow_assignment` and `to_claim` are those two steps as both loops (`consumer.StreamProcessor`
and `judge_loop.JudgeProcessor`) take them from their source after every poll.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from stream_ndcg.source.base import Partition, Source

logger = logging.getLogger(__name__)


@dataclass
class Claim:
    """An owned partition: its fencing token, and the next offset to consume as the store holds it
    (None: never committed)."""

    epoch: str
    offset: int | None


class Ownership:
    def __init__(self) -> None:
        self._owned: dict[Partition, Claim] = {}
        self._unclaimed: set[Partition] = set()
        self._halted: set[Partition] = set()

    def sync(self, assignment: Collection[Partition], revoked: Collection[Partition]) -> tuple[set[Partition],
                                                                                                 set[Partition]]:
        """Follow the group's assignment: forget what was revoked or is no longer assigned (a
        partition revoked and given straight back must be claimed again), and queue the new
        partitions for a claim. Returns (gone, new)."""
        held = set(self._owned) | self._unclaimed | self._halted
        current = set(assignment)
        gone = (held - current) | (set(revoked) & held)
        for partition in gone:
            self._owned.pop(partition, None)
            self._unclaimed.discard(partition)
            self._halted.discard(partition)
        new = current - set(self._owned) - self._unclaimed - self._halted
        self._unclaimed |= new
        return gone, new

    def pending(self, assignment: Collection[Partition]) -> list[Partition]:
        """The unclaimed partitions still assigned, in name order; the rest are forgotten."""
        self._unclaimed &= set(assignment)
        return sorted(self._unclaimed, key=lambda p: p.name)

    def claimed(self, partition: Partition, epoch: str, offset: int | None) -> None:
        self._unclaimed.discard(partition)
        self._owned[partition] = Claim(epoch, offset)

    def halt(self, partition: Partition) -> None:
        """Neither claim nor read it while it stays assigned: it is missing records."""
        self._unclaimed.discard(partition)
        self._halted.add(partition)

    def committed(self, partition: Partition, next_offset: int) -> None:
        """The store holds the partition's batch up to `next_offset`."""
        self._owned[partition].offset = next_offset

    def release(self, partitions: Collection[Partition]) -> None:
        """Claim these again before writing: fenced, or a commit of unknown outcome."""
        for partition in partitions:
            if self._owned.pop(partition, None) is not None:
                self._unclaimed.add(partition)

    def release_all(self) -> None:
        """After any store failure: a commit whose reply was lost may or may not have landed."""
        self.release(list(self._owned))

    def owns(self, partition: Partition) -> bool:
        return partition in self._owned

    def claim(self, partition: Partition) -> Claim:
        return self._owned[partition]

    def owned(self) -> Iterator[tuple[Partition, Claim]]:
        yield from self._owned.items()

    def offsets(self) -> dict[Partition, int]:
        """The next offset of each owned partition that has one."""
        return {p: c.offset for p, c in self._owned.items() if c.offset is not None}

    @property
    def settled(self) -> bool:
        """Every assigned partition is claimed (none waits, none is halted)."""
        return not self._unclaimed and not self._halted

    def __len__(self) -> int:
        return len(self._owned)


def follow_assignment(ownership: Ownership, source: Source, forget: Callable[[Partition], None]) -> None:
    """Bring `ownership` in line with the source's assignment and revocations (`Ownership.sync`),
    call `forget` with each partition gone (the loop drops what it kept of it: its lag report,
    its judge), and log what was revoked and assigned. Nothing is paused: records of a partition
    not yet claimed are dropped, and its claim seeks to the stored offset."""
    gone, new = ownership.sync(source.assignment(), source.revoked())
    for partition in gone:
        forget(partition)
    if gone:
        logger.info("revoked %s", ", ".join(sorted(p.name for p in gone)))
    if new:
        logger.info("assigned %s", ", ".join(sorted(p.name for p in new)))


def to_claim(ownership: Ownership, source: Source, claim: Callable[[str], str]) -> Iterator[tuple[Partition, str]]:
    """Each assigned partition waiting for a claim, in name order, with the new epoch `claim` (the
    store's) gives it, which fences every earlier holder; the loop then reads where to resume and
    calls `Ownership.claimed`."""
    for partition in ownership.pending(source.assignment()):
        yield partition, claim(partition.name)
