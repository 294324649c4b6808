"""One contract, two stores: the in-memory twin and the Redis store behave the same."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from stream_ndcg.devtools.servers import RedisClusterNodes, RedisServer
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.engine import Engine
from stream_ndcg.errors import ConfigError, FencedError, StoreUnavailable
from stream_ndcg.events import Impression, InvalidEvent, parse_event
from stream_ndcg.metric import Measure
from stream_ndcg.redis_store import RedisStore, connect
from stream_ndcg.store import Commit, MemoryStore, StateStore
from stream_ndcg.windows import window_means

MEASURE = Measure(cutoffs=(3, 10))
BUCKET = 60_000
HORIZON = 3_600_000


@pytest.fixture(params=["memory", "redis-cold", "redis-cached", "redis-cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[StateStore]:
    if request.param == "memory":
        yield MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON)
        return
    cluster = request.param == "redis-cluster"
    server = request.getfixturevalue("redis_cluster" if cluster else "redis_server")
    client = connect(server.url, cluster=cluster)
    # Without a cache every batch reads its query states back from Redis.
    yield RedisStore(client, namespace=f"c-{uuid.uuid4().hex[:8]}", bucket_ms=BUCKET, horizon_ms=HORIZON,
                     state_ttl_ms=HORIZON, wall_clock=False,
                     cache_groups=0 if request.param in ("redis-cold", "redis-cluster") else 1000)
    client.close()


def apply(store: StateStore, engine: Engine, partition: str, epoch: str, raw: list[bytes], offset: int,
          expected: int | None | str = "stored") -> None:
    events = [parse_event(m) for m in raw]
    valid = [e for e in events if not isinstance(e, InvalidEvent)]
    snapshot = store.load(partition, {e.query_id for e in valid},
                          {e.impression_id: engine.bucket_of(e.ts) for e in valid if isinstance(e, Impression)})
    outcome = engine.apply(events, snapshot.states, snapshot.known_impressions, snapshot.clock_ms, event_clock=True)
    before = store.next_offset(partition) if expected == "stored" else expected
    assert not isinstance(before, str)
    store.commit([Commit(partition, epoch, outcome, offset, before)])


def test_claims_fence_earlier_holders(store: StateStore) -> None:
    first = store.claim("t:0")
    second = store.claim("t:0")
    assert second != first
    engine = Engine(MEASURE, BUCKET)
    with pytest.raises(FencedError):
        apply(store, engine, "t:0", first, [], 1)
    assert store.next_offset("t:0") is None
    apply(store, engine, "t:0", second, [], 7)
    assert store.next_offset("t:0") == 7
    assert store.next_offset("t:1") is None


def test_commits_round_trip_and_add_up_across_partitions(store: StateStore) -> None:
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
    messages = [v for _, v in Simulator(SimulationSpec(events=3000, seed=3, queries=50, rate=50.0,
                                                         malformed_share=0.02)).messages()]
    epochs = {p: store.claim(p) for p in ("t:0", "t:1")}
    memory = MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON)
    memory_epoch = memory.claim("all")
    for start in range(0, len(messages), 250):
        chunk = messages[start:start + 250]
        # Queries split by partition, as Kafka keys would split them.
        by_partition: dict[str, list[bytes]] = {"t:0": [], "t:1": []}
        for message in chunk:
            event = parse_event(message)
            key = event.query_id if not isinstance(event, InvalidEvent) else ""
            by_partition[f"t:{sum(key.encode()) % 2}"].append(message)
        redelivered = {partition: raw + raw[:3] for partition, raw in by_partition.items()}
        for partition, raw in redelivered.items():
            apply(store, engine, partition, epochs[partition], raw, start + 250)
        apply(memory, engine, "all", memory_epoch, redelivered["t:0"] + redelivered["t:1"], start + 250)
    assert store.counts() == memory.counts()
    assert store.clock_ms() == memory.clock_ms()
    ours, reference = window_means(store.aggregates(), MEASURE.cutoffs), window_means(memory.aggregates(),
                                                                                     MEASURE.cutoffs)
    for k, row in reference.items():
        for name, value in row.items():
            assert ours[k][name] == pytest.approx(value, abs=1e-9), (k, name)
    assert store.counts()["duplicate:impression"] > 0
    oldest = min(key[0] for key in store.aggregates())
    assert store.aggregates(since_bucket=oldest + 1).keys() == {k for k in store.aggregates() if k[0] > oldest}


def test_a_commit_from_another_offset_than_the_stored_one_is_refused(store: StateStore) -> None:
    engine = Engine(MEASURE, BUCKET)
    epoch = store.claim("t:0")
    apply(store, engine, "t:0", epoch, [], 10, expected=None)
    with pytest.raises(FencedError, match="offset"):
        apply(store, engine, "t:0", epoch, [], 20, expected=None)
    with pytest.raises(FencedError, match="offset"):
        apply(store, engine, "t:0", epoch, [], 20, expected=9)
    apply(store, engine, "t:0", epoch, [], 20, expected=10)
    assert store.next_offset("t:0") == 20


def test_an_impression_id_seen_again_is_a_duplicate_whatever_its_time(store: StateStore) -> None:
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
    epoch = store.claim("t:0")
    t0 = 1_763_683_200_000
    first = b'{"type":"impression","impression_id":"i","query_id":"q","ts":%d,"results":["a"]}' % t0
    again = b'{"type":"impression","impression_id":"i","query_id":"q","ts":%d,"results":["a"]}' % (t0 + 5 * BUCKET)
    apply(store, engine, "t:0", epoch, [first], 1)
    apply(store, engine, "t:0", epoch, [again], 2)
    assert store.counts()["impression"] == 1
    assert store.counts()["duplicate:impression"] == 1


def test_ranked_lists_are_kept_deduplicated_with_counts(store: StateStore) -> None:
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
    epoch = store.claim("t:0")
    t0 = 1_763_683_200_000
    shown = [b'{"type":"impression","impression_id":"%d","query_id":"q","ts":%d,"results":["a","b"]}' % (i, t0 + i)
             for i in range(3)]
    other = b'{"type":"impression","impression_id":"x","query_id":"q","ts":%d,"results":["b"],' \
            b'"segment":{"variant":"B"}}' % (t0 + BUCKET)
    apply(store, engine, "t:0", epoch, shown[:2], 2)
    apply(store, engine, "t:0", epoch, [shown[2], other], 4)
    bucket = t0 // BUCKET
    assert store.ranked_lists("t:0", "q") == {(bucket, "{}", ("a", "b")): 3,
                                              (bucket + 1, '{"variant":"B"}', ("b",)): 1}
    assert store.ranked_lists("t:0", "unknown") == {}


def test_segment_values_are_admitted_up_to_the_cap(store: StateStore) -> None:
    assert [store.admit("variant", v, 2) for v in ("A", "B", "C", "A", "D", "B")] == [
        True, True, False, True, False, True]
    assert store.admit("engine", "x", 1)


def test_a_redis_outage_is_a_recoverable_error() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    store = RedisStore(client, namespace="down", bucket_ms=BUCKET, horizon_ms=HORIZON,
                       state_ttl_ms=HORIZON)
    with pytest.raises(StoreUnavailable, match="Redis claim failed"):
        store.claim("t:0")


def test_an_unreachable_cluster_is_a_recoverable_error_retried_on_the_next_round_trip() -> None:
    attempts = []

    def unreachable() -> redis.RedisCluster:
        attempts.append(1)
        return connect("redis://127.0.0.1:1/0", cluster=True)  # type: ignore[return-value]

    store = RedisStore(unreachable, namespace="down", bucket_ms=BUCKET, horizon_ms=HORIZON, state_ttl_ms=HORIZON)
    for _ in range(2):
        with pytest.raises(StoreUnavailable, match="Redis Cluster unreachable"):
            store.claim("t:0")
    assert len(attempts) == 2


def test_a_single_server_client_pointed_at_a_cluster_says_how_to_fix_it(redis_cluster: RedisClusterNodes) -> None:
    with redis.Redis.from_url(redis_cluster.url) as client:
        store = RedisStore(client, namespace="misconfigured", bucket_ms=BUCKET, horizon_ms=HORIZON,
                           state_ttl_ms=HORIZON)
        # Some of these partitions' slots are on other nodes than the one in the URL.
        with pytest.raises(StoreUnavailable, match="set redis_cluster"):
            for partition in range(20):
                store.claim(f"t:{partition}")


def test_state_built_with_another_metric_configuration_is_refused_unless_rebuilt(store: StateStore) -> None:
    linear = {"k": [3, 10], "gain": "linear", "ideal": "pool"}
    exponential = dict(linear, gain="exponential")
    assert store.adopt(linear) is False
    assert store.adopt(linear) is False
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
    t0 = 1_763_683_200_000
    shown = b'{"type":"impression","impression_id":"i","query_id":"q","ts":%d,"results":["a"]}' % t0
    apply(store, engine, "t:0", store.claim("t:0"), [shown], 1)
    with pytest.raises(ConfigError, match="gain: state built with 'linear', configured 'exponential'"):
        store.adopt(exponential)
    assert store.counts()["impression"] == 1
    assert store.adopt(exponential, rebuild=True) is True
    assert store.next_offset("t:0") is None
    assert not store.counts() and not store.aggregates() and store.ranked_lists("t:0", "q") == {}
    apply(store, engine, "t:0", store.claim("t:0"), [shown], 1)
    assert store.counts()["impression"] == 1
    assert store.adopt(exponential, rebuild=True) is False
    with pytest.raises(ConfigError, match="gain"):
        store.adopt(linear)


def test_state_in_another_format_is_refused_and_state_without_one_is_todays(redis_server: RedisServer,
                                                                            redis_client: redis.Redis) -> None:
    namespace = f"f-{uuid.uuid4().hex[:8]}"
    client = connect(redis_server.url)
    store = RedisStore(client, namespace=namespace, bucket_ms=BUCKET, horizon_ms=HORIZON, state_ttl_ms=HORIZON)
    config, key = {"k": [3, 10]}, f"{{{namespace}}}:format"
    assert store.adopt(config) is False
    assert redis_client.get(key) == b"1"
    redis_client.delete(key)  # as the release before the version was recorded left it
    assert store.adopt(config) is False
    assert redis_client.get(key) == b"1"
    redis_client.set(key, "2")
    with pytest.raises(ConfigError, match="format version '2'"):
        store.adopt(config, rebuild=True)
    client.close()
