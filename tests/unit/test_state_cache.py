"""The Redis store's cache of query states: bounded by groups and by estimated bytes across partitions, LRU,
deadlines."""

from __future__ import annotations

from stream_ndcg.query_state import Group, QueryState
from stream_ndcg.state.cache import GROUP_BYTES, STATE_BYTES, StateCache, estimated_bytes

# A bound on bytes that the tests of the bound on groups never reach.
UNBOUNDED = 2**40


def state(groups: int) -> QueryState:
    return QueryState(groups={(bucket, "{}"): Group() for bucket in range(groups)})


def test_least_recently_used_states_leave_first_once_their_groups_pass_the_bound() -> None:
    cache = StateCache(most_groups=10, most_bytes=UNBOUNDED)
    cache.put("t:0", {"a": state(3), "b": state(3)}, deadline=100.0)  # 4 + 4 groups with the query itself
    assert cache.get("t:0", "a", now=1.0) is not None  # a is now the more recent
    cache.put("t:1", {"c": state(2)}, deadline=100.0)  # 11 groups: b goes
    assert cache.get("t:0", "b", now=1.0) is None
    assert cache.get("t:0", "a", now=1.0) is not None and cache.get("t:1", "c", now=1.0) is not None
    assert cache.groups == 7


def test_a_state_written_again_is_weighed_again() -> None:
    cache = StateCache(most_groups=100, most_bytes=UNBOUNDED)
    grown = state(1)
    cache.put("t:0", {"a": grown}, deadline=100.0)
    grown.groups[(99, "{}")] = Group()
    cache.put("t:0", {"a": grown}, deadline=100.0)
    assert cache.groups == 3


def test_entries_expire_at_their_deadline_and_with_their_partition() -> None:
    cache = StateCache(most_groups=100, most_bytes=UNBOUNDED)
    cache.put("t:0", {"a": state(1), "b": state(1)}, deadline=5.0)
    cache.put("t:1", {"a": state(1)}, deadline=50.0)
    assert cache.get("t:0", "a", now=5.0) is None
    cache.forget("t:0")
    assert cache.get("t:0", "b", now=1.0) is None
    assert cache.get("t:1", "a", now=1.0) is not None
    assert cache.groups == 2


def test_a_zero_bound_keeps_nothing() -> None:
    cache = StateCache(most_groups=0, most_bytes=UNBOUNDED)
    cache.put("t:0", {"a": state(2)}, deadline=100.0)
    assert cache.get("t:0", "a", now=1.0) is None and cache.groups == 0


def listed(lists: int, length: int = 10) -> QueryState:
    """A state of one group showing `lists` distinct lists of `length` results."""
    group = Group()
    for n in range(lists):
        group.add_list(tuple(f"q{n}-d{rank}" for rank in range(length)), 1, length)
    return QueryState(groups={(0, "{}"): group})


def test_a_state_is_estimated_by_its_groups_distinct_lists_their_length_and_judged_documents() -> None:
    assert estimated_bytes(state(0)) == STATE_BYTES
    assert estimated_bytes(state(2)) == STATE_BYTES + 2 * GROUP_BYTES
    few, many, longer = estimated_bytes(listed(10)), estimated_bytes(listed(1000)), estimated_bytes(listed(10, 40))
    assert estimated_bytes(listed(0)) < few < longer < many
    # A thousand lists of ten cost as much as a process holds for them: over a KiB each.
    assert many - few > 990 * 1024
    judged = listed(10)
    judged.add_revision("q0-d0", (1, "e1", 2.0, "rater"), ("rater",))
    assert estimated_bytes(judged) > few


def test_least_recently_used_states_leave_first_once_their_bytes_pass_the_bound() -> None:
    small, large = listed(2), listed(200)
    cache = StateCache(most_groups=1000, most_bytes=estimated_bytes(large) + 2 * estimated_bytes(small) - 1)
    cache.put("t:0", {"a": listed(2), "b": listed(2)}, deadline=100.0)
    assert cache.get("t:0", "a", now=1.0) is not None  # a is now the more recent
    cache.put("t:1", {"c": large}, deadline=100.0)  # past the bound by b
    assert cache.get("t:0", "b", now=1.0) is None
    assert cache.get("t:0", "a", now=1.0) is not None and cache.get("t:1", "c", now=1.0) is large
    assert cache.bytes == estimated_bytes(large) + estimated_bytes(small) <= cache.most_bytes
    assert cache.groups == 4


def test_a_state_grown_past_the_bound_alone_leaves_and_the_others_stay() -> None:
    grown, other = listed(2), listed(2)
    cache = StateCache(most_groups=1000, most_bytes=4 * estimated_bytes(grown))
    cache.put("t:0", {"a": grown, "b": other}, deadline=100.0)
    for n in range(400):
        grown.groups[(0, "{}")].add_list(tuple(f"more{n}-d{rank}" for rank in range(10)), 1, 10)
    cache.put("t:0", {"a": grown}, deadline=100.0)  # alone past the bound: it leaves, b stays
    assert cache.get("t:0", "a", now=1.0) is None and cache.get("t:0", "b", now=1.0) is other
    assert cache.bytes == estimated_bytes(other) and cache.groups == 2
    assert cache.figures().evictions == 1


def test_a_state_with_more_groups_than_the_bound_is_not_kept_and_the_others_stay() -> None:
    cache = StateCache(most_groups=5, most_bytes=UNBOUNDED)
    kept = state(1)
    cache.put("t:0", {"a": kept, "b": state(5)}, deadline=100.0)
    assert cache.get("t:0", "a", now=1.0) is kept and cache.get("t:0", "b", now=1.0) is None
    assert cache.groups == 2


def test_a_zero_byte_bound_keeps_nothing() -> None:
    cache = StateCache(most_groups=100, most_bytes=0)
    cache.put("t:0", {"a": state(2)}, deadline=100.0)
    assert cache.get("t:0", "a", now=1.0) is None and cache.bytes == 0


def test_hits_misses_and_evictions_are_counted_and_what_is_held_is_said() -> None:
    cache = StateCache(most_groups=4, most_bytes=UNBOUNDED)
    cache.put("t:0", {"a": state(1), "b": state(1)}, deadline=5.0)
    assert cache.get("t:0", "a", now=1.0) is not None
    assert cache.get("t:0", "nobody", now=1.0) is None
    assert cache.get("t:0", "b", now=5.0) is None  # past its deadline: a miss, not an eviction
    cache.put("t:1", {"c": state(1), "d": state(1)}, deadline=50.0)  # 6 groups: a goes, then all fit
    figures = cache.figures()
    assert (figures.hits, figures.misses, figures.evictions) == (1, 2, 1)
    assert figures.states == 2 and figures.estimated_bytes == cache.bytes == 2 * estimated_bytes(state(1))
