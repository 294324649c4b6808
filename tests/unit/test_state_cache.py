"""The Redis store's cache of query states: bounded by groups and by estimated bytes across partitions, the
least recently used leaving for a state asked for more often, deadlines."""

from __future__ import annotations

from array import array

from stream_ndcg.query_state import Group, QueryState
from stream_ndcg.state.cache import (
    AGING_LOOKUPS_LEAST,
    DEMAND_COUNTERS,
    GROUP_BYTES,
    STATE_BYTES,
    StateCache,
    estimated_bytes,
    halved_counts,
)

# A bound on bytes that the tests of the bound on groups never reach.
UNBOUNDED = 2**40


def state(groups: int) -> QueryState:
    return QueryState(groups={(bucket, "{}"): Group() for bucket in range(groups)})


def written(cache: StateCache, partition: str, states: dict[str, QueryState], deadline: float = 100.0) -> None:
    """As the store does: a batch asks for each state before it writes it."""
    for query_id in states:
        cache.get(partition, query_id, now=0.0)
    cache.put(partition, states, deadline, now=0.0)


def test_least_recently_used_states_leave_first_once_their_groups_pass_the_bound() -> None:
    cache = StateCache(most_groups=10, most_bytes=UNBOUNDED)
    written(cache, "t:0", {"a": state(3), "b": state(3)})  # 4 + 4 groups with the query itself
    assert cache.get("t:0", "a", now=1.0) is not None  # a is now the more recent
    cache.get("t:1", "c", now=1.0)  # c, asked for twice by its write, b once
    written(cache, "t:1", {"c": state(2)})  # 11 groups: b goes
    assert cache.get("t:0", "b", now=1.0) is None
    assert cache.get("t:0", "a", now=1.0) is not None and cache.get("t:1", "c", now=1.0) is not None
    assert cache.groups == 7


def test_a_state_written_again_is_weighed_again() -> None:
    cache = StateCache(most_groups=100, most_bytes=UNBOUNDED)
    grown = state(1)
    cache.put("t:0", {"a": grown}, deadline=100.0, now=0.0)
    grown.groups[(99, "{}")] = Group()
    cache.put("t:0", {"a": grown}, deadline=100.0, now=0.0)
    assert cache.groups == 3


def test_entries_expire_at_their_deadline_and_with_their_partition() -> None:
    cache = StateCache(most_groups=100, most_bytes=UNBOUNDED)
    cache.put("t:0", {"a": state(1), "b": state(1)}, deadline=5.0, now=0.0)
    cache.put("t:1", {"a": state(1)}, deadline=50.0, now=0.0)
    assert cache.get("t:0", "a", now=5.0) is None
    cache.forget("t:0")
    assert cache.get("t:0", "b", now=1.0) is None
    assert cache.get("t:1", "a", now=1.0) is not None
    assert cache.groups == 2


def test_a_zero_bound_keeps_nothing() -> None:
    cache = StateCache(most_groups=0, most_bytes=UNBOUNDED)
    cache.put("t:0", {"a": state(2)}, deadline=100.0, now=0.0)
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
    written(cache, "t:0", {"a": listed(2), "b": listed(2)})
    assert cache.get("t:0", "a", now=1.0) is not None  # a is now the more recent
    cache.get("t:1", "c", now=1.0)
    written(cache, "t:1", {"c": large})  # past the bound by b, asked for less often than c
    assert cache.get("t:0", "b", now=1.0) is None
    assert cache.get("t:0", "a", now=1.0) is not None and cache.get("t:1", "c", now=1.0) is large
    assert cache.bytes == estimated_bytes(large) + estimated_bytes(small) <= cache.most_bytes
    assert cache.groups == 4


def test_a_state_grown_past_the_bound_leaves_alone_and_the_others_stay() -> None:
    grown = listed(2)
    cache = StateCache(most_groups=1000, most_bytes=4 * estimated_bytes(grown))
    written(cache, "t:0", {"a": grown, "b": listed(2)})
    for n in range(400):
        grown.groups[(0, "{}")].add_list(tuple(f"more{n}-d{rank}" for rank in range(10)), 1, 10)
    written(cache, "t:0", {"a": grown})  # alone past the bound: it goes, and dropping b would not help
    assert cache.get("t:0", "a", now=1.0) is None
    assert cache.get("t:0", "b", now=1.0) is not None
    assert cache.bytes == estimated_bytes(listed(2)) and cache.groups == 2


def test_a_zero_byte_bound_keeps_nothing() -> None:
    cache = StateCache(most_groups=100, most_bytes=0)
    cache.put("t:0", {"a": state(2)}, deadline=100.0, now=0.0)
    assert cache.get("t:0", "a", now=1.0) is None and cache.bytes == 0


def test_hits_misses_and_evictions_are_counted_and_what_is_held_is_said() -> None:
    cache = StateCache(most_groups=4, most_bytes=UNBOUNDED)
    cache.put("t:0", {"a": state(1), "b": state(1)}, deadline=5.0, now=0.0)
    assert cache.get("t:0", "a", now=1.0) is not None
    assert cache.get("t:0", "nobody", now=1.0) is None
    assert cache.get("t:0", "b", now=5.0) is None  # past its deadline: a miss, not an eviction
    for _ in range(2):
        cache.get("t:1", "c", now=1.0)
    # c fits; d, asked for less than a, is not kept
    cache.put("t:1", {"c": state(1), "d": state(1)}, deadline=50.0, now=0.0)
    figures = cache.figures()
    assert (figures.hits, figures.misses, figures.evictions) == (1, 4, 1)
    assert figures.states == 2 and figures.estimated_bytes == cache.bytes == 2 * estimated_bytes(state(1))


def test_a_state_asked_for_often_outlasts_a_stream_of_states_asked_for_once() -> None:
    """What plain LRU would lose: the tail's one-off states would push the head query out."""
    cache = StateCache(most_groups=3 * 2, most_bytes=UNBOUNDED)  # three states of one group
    head = state(1)
    for n in range(100):
        if n % 5 == 0:
            written(cache, "t:0", {"head": head})
        written(cache, "t:0", {f"tail{n}": state(1)})  # as many as the cache holds between two of the head's
    assert cache.get("t:0", "head", now=1.0) is head
    assert cache.groups <= cache.most_groups


def test_a_state_asked_for_more_often_takes_the_place_of_one_asked_for_less() -> None:
    cache = StateCache(most_groups=2 * 2, most_bytes=UNBOUNDED)
    written(cache, "t:0", {"a": state(1), "b": state(1)})
    for _ in range(3):
        cache.get("t:0", "c", now=1.0)  # missed three times: read back from Redis each time
    cache.get("t:0", "b", now=1.0)
    written(cache, "t:0", {"c": state(1)})
    assert cache.get("t:0", "a", now=1.0) is None  # the least recently used, asked for less than c
    assert cache.get("t:0", "b", now=1.0) is not None and cache.get("t:0", "c", now=1.0) is not None
    assert cache.figures().evictions == 1


def test_what_was_asked_for_long_ago_counts_for_less_than_what_is_asked_for_now() -> None:
    cache = StateCache(most_groups=2, most_bytes=UNBOUNDED)
    for _ in range(8):
        cache.get("t:0", "old", now=1.0)
    written(cache, "t:0", {"old": state(1)})
    for _ in range(AGING_LOOKUPS_LEAST):  # counts halved once: old's to 4
        cache.get("t:0", "other", now=1.0)
    for _ in range(4):
        cache.get("t:0", "new", now=1.0)
    written(cache, "t:0", {"new": state(1)})  # asked for 5 times, against old's 9 halved to 4
    assert cache.get("t:0", "new", now=1.0) is not None
    assert cache.get("t:0", "old", now=1.0) is None


def test_a_state_written_again_makes_room_among_those_asked_for_as_often() -> None:
    cache = StateCache(most_groups=4, most_bytes=UNBOUNDED)
    grown = state(1)
    written(cache, "t:0", {"b": state(1), "a": grown})  # 2 + 2 groups, each asked for once
    grown.groups[(1, "{}")] = Group()
    cache.put("t:0", {"a": grown}, deadline=100.0, now=0.0)  # 3 groups: b, the least recently used, goes
    assert cache.get("t:0", "a", now=1.0) is grown
    assert cache.get("t:0", "b", now=1.0) is None


def test_a_state_written_again_is_not_kept_if_those_that_would_make_room_are_asked_for_more() -> None:
    cache = StateCache(most_groups=4, most_bytes=UNBOUNDED)
    for _ in range(5):
        cache.get("t:0", "hot", now=1.0)
    grown = state(1)
    written(cache, "t:0", {"hot": state(1), "cold": grown})
    grown.groups[(1, "{}")] = Group()
    cache.put("t:0", {"cold": grown}, deadline=100.0, now=0.0)  # would need hot's room
    assert cache.get("t:0", "cold", now=1.0) is None
    assert cache.get("t:0", "hot", now=1.0) is not None
    assert (cache.groups, cache.bytes, cache.figures().evictions) == (2, estimated_bytes(state(1)), 1)


def test_a_new_state_asked_for_as_often_as_the_least_recently_used_is_not_kept() -> None:
    cache = StateCache(most_groups=2, most_bytes=UNBOUNDED)
    written(cache, "t:0", {"first": state(1)})
    written(cache, "t:0", {"second": state(1)})
    assert cache.get("t:0", "second", now=1.0) is None
    assert cache.get("t:0", "first", now=1.0) is not None


def test_a_state_past_its_deadline_makes_room_however_often_it_was_asked_for() -> None:
    cache = StateCache(most_groups=2, most_bytes=UNBOUNDED)
    for _ in range(5):
        cache.get("t:0", "stale", now=1.0)
    written(cache, "t:0", {"stale": state(1)}, deadline=10.0)
    cache.put("t:0", {"fresh": state(1)}, deadline=100.0, now=10.0)
    assert cache.get("t:0", "fresh", now=11.0) is not None


def test_the_states_asked_for_now_take_the_place_of_those_asked_for_before_within_a_few_halvings() -> None:
    """Traffic that moves (or a partition given up) leaves counts behind; they fade in proportion to
    the cache's size, not to how long the old keys were hot."""
    cache = StateCache(most_groups=8, most_bytes=UNBOUNDED)  # four states of one group
    old, new = [f"old{n}" for n in range(4)], [f"new{n}" for n in range(4)]
    for _ in range(10_000):
        for query_id in old:
            cache.get("t:0", query_id, now=1.0)
    written(cache, "t:0", {query_id: state(1) for query_id in old})
    for _ in range(3_000):
        written(cache, "t:0", {query_id: state(1) for query_id in new})
    assert all(cache.get("t:0", query_id, now=1.0) is not None for query_id in new)


def test_halving_the_counts_halves_each_one() -> None:
    counts = array("H", [0, 1, 2, 3, 0xFFFF, 0x8000, 0x7FFF] + [5] * (DEMAND_COUNTERS - 7))
    assert list(halved_counts(counts)) == [count >> 1 for count in counts]
