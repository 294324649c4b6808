"""The query states an instance wrote, kept so that its next batches need not read them back.

Only the instance holding a partition writes it, so what it wrote last is what
Redis holds, for as long as the key's TTL runs: the Redis store asks this cache
first and reads from Redis only the states it has not got. The store drops a
partition's entries on every claim and every failed commit.

    cache = StateCache(most_groups=20_000, most_bytes=128 * 2**20)
    cache.put("topic:0", outcome.touched, deadline=time.monotonic() + 60)
    state = cache.get("topic:0", "q1", now=time.monotonic())
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import NamedTuple

from stream_ndcg.query_state import QueryState

# What a state costs in this process, by the parts it grows with: fitted by least squares to the
# deep size (every object reachable, the stored form's side tables included) of each state after a
# run of the service bench's workload (bench/RESULTS.md, Memory over time, says how close the sum
# comes). A distinct ranked list costs the most: its tuple, its own copies of the document ids,
# its DCGs and its places in the index of the lists that show each document.
STATE_BYTES = 4096
GROUP_BYTES = 3840
LIST_BYTES = 400
LISTED_RESULT_BYTES = 100
JUDGED_DOC_BYTES = 2816


def estimated_bytes(state: QueryState) -> int:
    """About how many bytes the state holds in this process: found from a few lengths, in time
    that grows with its groups, not with its lists or places. A group's lists are taken to be as
    long as one of them."""
    size = STATE_BYTES + JUDGED_DOC_BYTES * len(state.revisions)
    for group in state.groups.values():
        lists = group.lists
        size += GROUP_BYTES
        if lists:
            size += len(lists) * (LIST_BYTES + LISTED_RESULT_BYTES * len(next(iter(lists))))
    return size


class CacheFigures(NamedTuple):
    """What a cache did since it was made, and what it holds now (the exporter's state cache metrics)."""

    # States a batch's load found here, and those it did not (read back from Redis, or new).
    hits: int
    misses: int
    # States dropped to keep within a bound: each one that is wanted again is read back whole.
    evictions: int
    states: int
    estimated_bytes: int


class StateCache:
    """The query states this instance wrote, least recently used first out, across all partitions,
    bounded twice: by their groups (one query's impressions in one bucket and segment) and by
    their estimated bytes (`estimated_bytes`), since a group's size grows with the distinct lists
    it holds and a bound on groups alone does not bound the memory. A state past a bound alone is
    not kept.

    An entry is trusted only until its deadline, while Redis surely still holds the state it
    mirrors (the key's TTL runs from our write). Leaving the cache never changes a result: the
    store reads a state it has not got from Redis.
    """

    def __init__(self, most_groups: int, most_bytes: int) -> None:
        self.most_groups = most_groups
        self.most_bytes = most_bytes
        self.groups = 0
        self.bytes = 0
        # (partition, query) -> (state, deadline, groups, estimated bytes)
        self._entries: OrderedDict[tuple[str, str], tuple[QueryState, float, int, int]] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, partition: str, query_id: str, now: float) -> QueryState | None:
        entry = self._entries.get((partition, query_id))
        if entry is not None and entry[1] <= now:
            self._drop((partition, query_id))
            entry = None
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end((partition, query_id))
        return entry[0]

    def put(self, partition: str, states: Mapping[str, QueryState], deadline: float) -> None:
        for query_id, state in states.items():
            key = (partition, query_id)
            if key in self._entries:
                self._drop(key)
            groups, size = len(state.groups) + 1, estimated_bytes(state)
            if self._past_bounds(groups, size):
                # Past a bound alone: put in, it would push every other state out, then itself.
                self.evictions += 1
                continue
            self._entries[key] = (state, deadline, groups, size)
            self.groups += groups
            self.bytes += size
        while self._past_bounds(self.groups, self.bytes):
            self._drop(next(iter(self._entries)))
            self.evictions += 1

    def figures(self) -> CacheFigures:
        return CacheFigures(self.hits, self.misses, self.evictions, len(self._entries), self.bytes)

    def forget(self, partition: str) -> None:
        for key in [key for key in self._entries if key[0] == partition]:
            self._drop(key)

    def forget_all(self) -> None:
        self._entries.clear()
        self.groups = 0
        self.bytes = 0

    def _past_bounds(self, groups: int, size: int) -> bool:
        return groups > self.most_groups or size > self.most_bytes

    def _drop(self, key: tuple[str, str]) -> None:
        _, _, groups, size = self._entries.pop(key)
        self.groups -= groups
        self.bytes -= size
