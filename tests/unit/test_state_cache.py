"""The Redis store's cache of query states: bounded by groups across partitions, LRU, deadlines."""

from __future__ import annotations

from stream_ndcg.query_state import Group, QueryState
from stream_ndcg.state.cache import StateCache


def state(groups: int) -> QueryState:
    return QueryState(groups={(bucket, "{}"): Group() for bucket in range(groups)})


def test_least_recently_used_states_leave_first_once_their_groups_pass_the_bound() -> None:
    cache = StateCache(most_groups=10)
    cache.put("t:0", {"a": state(3), "b": state(3)}, deadline=100.0)  # 4 + 4 groups with the query itself
    assert cache.get("t:0", "a", now=1.0) is not None  # a is now the more recent
    cache.put("t:1", {"c": state(2)}, deadline=100.0)  # 11 groups: b goes
    assert cache.get("t:0", "b", now=1.0) is None
    assert cache.get("t:0", "a", now=1.0) is not None and cache.get("t:1", "c", now=1.0) is not None
    assert cache.groups == 7


def test_a_state_written_again_is_weighed_again() -> None:
    cache = StateCache(most_groups=100)
    grown = state(1)
    cache.put("t:0", {"a": grown}, deadline=100.0)
    grown.groups[(99, "{}")] = Group()
    cache.put("t:0", {"a": grown}, deadline=100.0)
    assert cache.groups == 3


def test_entries_expire_at_their_deadline_and_with_their_partition() -> None:
    cache = StateCache(most_groups=100)
    cache.put("t:0", {"a": state(1), "b": state(1)}, deadline=5.0)
    cache.put("t:1", {"a": state(1)}, deadline=50.0)
    assert cache.get("t:0", "a", now=5.0) is None
    cache.forget("t:0")
    assert cache.get("t:0", "b", now=1.0) is None
    assert cache.get("t:1", "a", now=1.0) is not None
    assert cache.groups == 2


def test_a_zero_bound_keeps_nothing() -> None:
    cache = StateCache(most_groups=0)
    cache.put("t:0", {"a": state(2)}, deadline=100.0)
    assert cache.get("t:0", "a", now=1.0) is None and cache.groups == 0
