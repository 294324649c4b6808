"""The query states an instance wrote, kept so that its next batches need not read them back.

Only the instance holding a partition writes it, so what it wrote last is what
Redis holds, for as long as the key's TTL runs: the Redis store asks this cache
first and reads from Redis only the states it has not got. The store drops a
partition's entries on every claim and every failed commit.

    cache = StateCache(most_groups=20_000, most_bytes=128 * 2**20)
    cache.put("topic:0", outcome.touched, deadline=time.monotonic() + 60, now=time.monotonic())
    state = cache.get("topic:0", "q1", now=time.monotonic())
"""

from __future__ import annotations

import sys
from array import array
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

# The demand table's counters (a power of two: a key's slot is its hash's low bits). They are halved
# once the lookups since the last halving reach AGING_PER_STATE times the states held (TinyLFU's
# sample: ten times the cache's size), and no fewer than AGING_LOOKUPS_LEAST: enough batches that
# a head query's count stands well above a tail query's one or two, few enough that the counts of
# queries no longer asked for (a partition given up, traffic that moved) fade within that many.
DEMAND_COUNTERS = 2**16
AGING_PER_STATE = 10
AGING_LOOKUPS_LEAST = 4096


# Each counter's bits but its top one, in the table's own layout.
_LOW_BITS = int.from_bytes(array("H", [0x7FFF] * DEMAND_COUNTERS).tobytes(), sys.byteorder)


def halved_counts(counts: array[int]) -> array[int]:
    """Every counter halved: the table taken as one integer, shifted and masked, in C (a loop over
    the counters in Python takes about eight times as long)."""
    shifted = (int.from_bytes(counts.tobytes(), sys.byteorder) >> 1) & _LOW_BITS
    halved = array("H")
    halved.frombytes(shifted.to_bytes(2 * len(counts), sys.byteorder))
    return halved


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
    """The query states this instance wrote, across all partitions, bounded twice: by their groups
    (one query's impressions in one bucket and segment) and by their estimated bytes
    (`estimated_bytes`), since a group's size grows with the distinct lists it holds and a bound on
    groups alone does not bound the memory.

    What leaves to make room is the least recently used, but only for a state asked for more often
    (TinyLFU's admission, Einziger et al.): a state missed is read back and decoded whole, so what
    a state saves per byte it holds is how often it is asked for. Plain LRU gives that up exactly
    when it matters: once the head queries' states outgrow the bound, the one-off states of the
    tail push each of them out before it is asked for again, and every batch reads them back. How
    often each state is asked for is counted in a table of small counters by the key's hash,
    halved every ten times as many lookups as the cache holds states, so that it follows the
    traffic as it moves. A state past its deadline makes room whatever its count.

    An entry is trusted only until its deadline, while Redis surely still holds the state it
    mirrors (the key's TTL runs from our write). Leaving the cache, or not being let in, never
    changes a result: the store reads a state it has not got from Redis.
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
        # How often each key was asked for, by its hash: saturating 16-bit counters, so that the
        # head queries' counts stay apart from each other's and above the rest.
        self._demand = array("H", bytes(2 * DEMAND_COUNTERS))
        self._lookups = 0

    def get(self, partition: str, query_id: str, now: float) -> QueryState | None:
        self._asked_for((partition, query_id))
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

    def put(self, partition: str, states: Mapping[str, QueryState], deadline: float, now: float) -> None:
        for query_id, state in states.items():
            key = (partition, query_id)
            held = key in self._entries
            if held:
                self._drop(key)
            groups, size = len(state.groups) + 1, estimated_bytes(state)
            victims = self._room_for(key, groups, size, held, now)
            if victims is None:
                # Those that would make room are asked for as often or more: not kept.
                self.evictions += 1
                continue
            for victim in victims:
                self._drop(victim)
            self.evictions += len(victims)
            self._entries[key] = (state, deadline, groups, size)
            self.groups += groups
            self.bytes += size

    def _room_for(self, key: tuple[str, str], groups: int, size: int, held: bool,
                  now: float) -> list[tuple[str, str]] | None:
        """The least recently used entries to drop so that a state of `groups` and `size` fits,
        each asked for less often than `key` (or as often, for a state the cache `held` before
        this write: it is the more recent) or past its deadline; None when it cannot fit so."""
        if groups > self.most_groups or size > self.most_bytes:
            return None
        over_groups = self.groups + groups - self.most_groups
        over_bytes = self.bytes + size - self.most_bytes
        victims: list[tuple[str, str]] = []
        if over_groups <= 0 and over_bytes <= 0:
            return victims
        # A tie keeps what is held: a state of the tail asked for once never displaces another.
        demand = self._demand[self._slot(key)] + (1 if held else 0)
        for victim, (_, deadline, victim_groups, victim_size) in self._entries.items():
            if deadline > now and self._demand[self._slot(victim)] >= demand:
                return None
            victims.append(victim)
            over_groups -= victim_groups
            over_bytes -= victim_size
            if over_groups <= 0 and over_bytes <= 0:
                return victims
        return None

    def _asked_for(self, key: tuple[str, str]) -> None:
        slot = self._slot(key)
        if self._demand[slot] < 0xFFFF:
            self._demand[slot] += 1
        self._lookups += 1
        if self._lookups >= max(AGING_LOOKUPS_LEAST, AGING_PER_STATE * len(self._entries)):
            self._demand = halved_counts(self._demand)
            self._lookups = 0

    @staticmethod
    def _slot(key: tuple[str, str]) -> int:
        return hash(key) & (DEMAND_COUNTERS - 1)

    def figures(self) -> CacheFigures:
        return CacheFigures(self.hits, self.misses, self.evictions, len(self._entries), self.bytes)

    def forget(self, partition: str) -> None:
        for key in [key for key in self._entries if key[0] == partition]:
            self._drop(key)

    def forget_all(self) -> None:
        self._entries.clear()
        self.groups = 0
        self.bytes = 0

    def _drop(self, key: tuple[str, str]) -> None:
        _, _, groups, size = self._entries.pop(key)
        self.groups -= groups
        self.bytes -= size
