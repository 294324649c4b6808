"""The query states an instance wrote, kept so that its next batches need not read them back.

Only the instance holding a partition writes it, so what it wrote last is what
Redis holds, for as long as the key's TTL runs: the Redis store asks this cache
first and reads from Redis only the states it has not got. The store drops a
partition's entries on every claim and every failed commit.

    cache = StateCache(most_groups=20_000)
    cache.put("topic:0", outcome.touched, deadline=time.monotonic() + 60)
    state = cache.get("topic:0", "q1", now=time.monotonic())
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from stream_ndcg.query_state import QueryState


class StateCache:
    """The query states this instance wrote, least recently used first out, bounded by their
    groups (a group, one query's impressions in one bucket and segment, is what a state's size
    grows with), across all partitions.

    An entry is trusted only until its deadline, while Redis surely still holds the state it
    mirrors (the key's TTL runs from our write).
    """

    def __init__(self, most_groups: int) -> None:
        self.most_groups = most_groups
        self.groups = 0
        self._entries: OrderedDict[tuple[str, str], tuple[QueryState, float, int]] = OrderedDict()

    def get(self, partition: str, query_id: str, now: float) -> QueryState | None:
        entry = self._entries.get((partition, query_id))
        if entry is None:
            return None
        if entry[1] <= now:
            self._drop((partition, query_id))
            return None
        self._entries.move_to_end((partition, query_id))
        return entry[0]

    def put(self, partition: str, states: Mapping[str, QueryState], deadline: float) -> None:
        for query_id, state in states.items():
            key = (partition, query_id)
            if key in self._entries:
                self._drop(key)
            weight = len(state.groups) + 1
            self._entries[key] = (state, deadline, weight)
            self.groups += weight
        while self.groups > self.most_groups:
            self._drop(next(iter(self._entries)))

    def forget(self, partition: str) -> None:
        for key in [key for key in self._entries if key[0] == partition]:
            self._drop(key)

    def forget_all(self) -> None:
        self._entries.clear()
        self.groups = 0

    def _drop(self, key: tuple[str, str]) -> None:
        self.groups -= self._entries.pop(key)[2]
