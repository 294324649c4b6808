"""The state-store contract run for the Redis store, on one server and on a cluster; and what only
the Redis store does: outages and misconfiguration. (tests/unit runs the contract for the in-memory store.)"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from stream_ndcg.devtools.redis_servers import RedisClusterNodes, RedisServer
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.engine import Engine
from stream_ndcg.errors import ConfigError, StoreUnavailable
from stream_ndcg.events import InvalidEvent
from stream_ndcg.offline.replay import Replay
from stream_ndcg.offline.totals import OVER_QUERIES
from stream_ndcg.state import format as state_format
from stream_ndcg.state import redis_reads
from stream_ndcg.state.base import Commit, StateStore
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.state.redis_reads import Client, connect
from stream_ndcg.windows import window_means
from tests.support.batches import apply_batch, parsed
from tests.support.store_contract import BUCKET, DEDUP_HORIZON, HORIZON, MEASURE, T0, StoreContract

pytestmark = pytest.mark.redis

# A bound on the cache's bytes that holds a few of the contract's query states (`estimated_bytes`):
# most leave it, and the largest never stays.
EVICTING_BYTES = 250_000


class TestRedisStore(StoreContract):
    # redis-format-7 (and 6): as an instance told to write a previous format (`state_format`) writes;
    # redis-evicting: a cache whose bound on bytes holds a few states, so that most leave it and
    # are read back.
    @pytest.fixture(params=["redis-cold", "redis-cached", "redis-evicting", "redis-cluster", "redis-format-7",
                            "redis-format-6"])
    def store(self, request: pytest.FixtureRequest) -> Iterator[StateStore]:
        cluster = request.param == "redis-cluster"
        server = request.getfixturevalue("redis_cluster" if cluster else "redis_server")
        client = connect(server.url, cluster=cluster)
        # Without a cache every batch reads its query states back from Redis.
        cache_groups = 1000 if request.param in ("redis-cached", "redis-evicting") else 0
        yield RedisStore(client, namespace=f"c-{uuid.uuid4().hex[:8]}", bucket_ms=BUCKET, horizon_ms=HORIZON,
                         state_ttl_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON, wall_clock=False,
                         cache_groups=cache_groups, cache_bytes=EVICTING_BYTES if request.param == "redis-evicting"
                         else 2**40, write_format=int(request.param[-1]) if "format" in request.param else 8)
        client.close()


def one_partition(redis_server: RedisServer, prefix: str, events: int, seed: int, rate: float = 5.0
                  ) -> tuple[Client, RedisStore, Engine, list[bytes]]:
    """A client, a store in a namespace of its own, an engine, and a simulated stream for it."""
    client = connect(redis_server.url)
    store = RedisStore(client, namespace=f"{prefix}-{uuid.uuid4().hex[:8]}", bucket_ms=BUCKET, horizon_ms=HORIZON,
                       state_ttl_ms=HORIZON, wall_clock=False)
    messages = [v for _, v in Simulator(SimulationSpec(events=events, seed=seed, queries=10, rate=rate)).messages()]
    return client, store, Engine(MEASURE, BUCKET, horizon_ms=HORIZON), messages


def test_a_reader_behind_the_trimmed_row_log_reads_the_rows_whole(redis_server: RedisServer) -> None:
    client, store, engine, messages = one_partition(redis_server, "trim", events=400, seed=8)
    epoch = store.claim("t:0")
    apply_batch(store, engine, "t:0", parsed(messages[:200]), epoch=epoch, next_offset=200)
    cursor = store.read_rows("t:0", None, since_bucket=0).cursor
    apply_batch(store, engine, "t:0", parsed(messages[200:]), epoch=epoch, next_offset=400)
    # What a reader away longer than ROW_LOG_MS finds: the entries after its cursor trimmed.
    client.xtrim(f"{{{store.namespace}:t:0}}:rowlog", maxlen=0)
    read = store.read_rows("t:0", cursor, since_bucket=0)
    assert read.whole
    assert {(b, s, q) for b, s, q, _ in read.rows} == {(b, s, q) for b, s, q, _ in
                                                        store.read_rows("t:0", None, since_bucket=0).rows}
    client.close()


@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "redis-cluster"])
def test_every_partitions_rows_are_read_together_whole_only_where_a_log_has_a_gap(
        request: pytest.FixtureRequest, cluster: bool) -> None:
    server = request.getfixturevalue("redis_cluster" if cluster else "redis_server")
    client = connect(server.url, cluster=cluster)
    store = RedisStore(client, namespace=f"gap-{uuid.uuid4().hex[:8]}", bucket_ms=BUCKET, horizon_ms=HORIZON,
                       state_ttl_ms=HORIZON, wall_clock=False)
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
    messages = [v for _, v in Simulator(SimulationSpec(events=1200, seed=10, queries=10, rate=5.0)).messages()]
    partitions = [f"t:{n}" for n in range(4)]
    epochs = {p: store.claim(p) for p in partitions}
    for at, partition in enumerate(partitions):
        apply_batch(store, engine, partition, parsed(messages[at * 150:(at + 1) * 150]), epoch=epochs[partition],
                    next_offset=150)
    cursors: dict[str, str | None] = {p: read.cursor for p, read in store.read_all_rows({}, since_bucket=0).items()}
    for at, partition in enumerate(partitions):
        apply_batch(store, engine, partition, parsed(messages[600 + at * 150:750 + at * 150]), epoch=epochs[partition],
                    next_offset=300)
    # t:2's reader was away longer than its log is kept: the entries after its cursor trimmed.
    client.xtrim(f"{{{store.namespace}:t:2}}:rowlog", maxlen=0)
    together = store.read_all_rows(cursors, since_bucket=0)
    assert [together[p].whole for p in partitions] == [False, False, True, False]
    assert together == {p: store.read_rows(p, cursors[p], since_bucket=0) for p in partitions}
    client.close()


def test_the_row_log_is_written_only_while_a_reader_holds_its_lease(redis_server: RedisServer) -> None:
    client, store, engine, messages = one_partition(redis_server, "lease", events=600, seed=9)
    log = f"{{{store.namespace}:t:0}}:rowlog"
    epoch = store.claim("t:0")
    apply_batch(store, engine, "t:0", parsed(messages[:200]), epoch=epoch, next_offset=200)
    assert not client.exists(log)
    cursor = store.read_rows("t:0", None, since_bucket=0).cursor
    apply_batch(store, engine, "t:0", parsed(messages[200:400]), epoch=epoch, next_offset=400)
    assert client.xlen(log) == 1
    assert not store.read_rows("t:0", cursor, since_bucket=0).whole
    # The reader went away: commits after its lease are not logged, and it reads whole when back.
    client.delete(f"{{{store.namespace}:t:0}}:reader")
    apply_batch(store, engine, "t:0", parsed(messages[400:]), epoch=epoch, next_offset=600)
    assert client.xlen(log) == 1
    assert store.read_rows("t:0", cursor, since_bucket=0).whole
    client.close()


def test_a_redis_outage_is_a_recoverable_error() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    store = RedisStore(client, namespace="down", bucket_ms=BUCKET, horizon_ms=HORIZON,
                       state_ttl_ms=HORIZON)
    with pytest.raises(StoreUnavailable, match="Redis claim failed"):
        store.claim("t:0")


def test_a_commit_begun_against_an_unreachable_server_is_a_recoverable_error() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    store = RedisStore(client, namespace="down", bucket_ms=BUCKET, horizon_ms=HORIZON, state_ttl_ms=HORIZON)
    outcome = Engine(MEASURE, BUCKET).apply([], {}, {})
    with pytest.raises(StoreUnavailable, match="Redis commit failed"):
        store.begin_commit([Commit("t:0", "some-epoch", outcome, 1, None)]).finish()


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


def test_state_in_a_later_format_is_refused_and_earlier_state_is_recorded_as_todays(
        redis_server: RedisServer) -> None:
    namespace = f"f-{uuid.uuid4().hex[:8]}"
    client, raw = connect(redis_server.url), redis.Redis.from_url(redis_server.url)
    store = RedisStore(client, namespace=namespace, bucket_ms=BUCKET, horizon_ms=HORIZON, state_ttl_ms=HORIZON)
    config, key = {"k": [3, 10]}, f"{{{namespace}}}:format"
    today = str(state_format.FORMAT_VERSION).encode()
    assert store.adopt(config) is False
    assert raw.get(key) == today == b"8"
    # As the releases before the version was recorded left it (0.1.0 among them), as the first ones
    # that recorded it did, as the release before the compact groups did, as the one before
    # judgment sources did, as the one before the sums of squares did, as the one before the
    # experiments' cells did, as the one before the groups' own hash did, and as the one before
    # the sharded rows and ids did: read, and recorded as today's.
    for earlier in (None, "1", "2", "3", "4", "5", "6", "7"):
        if earlier is None:
            raw.delete(key)
        else:
            raw.set(key, earlier)
        assert store.adopt(config) is False
        assert raw.get(key) == today
    raw.set(key, "9")
    with pytest.raises(ConfigError, match="format version '9'"):
        store.adopt(config, rebuild=True)
    assert raw.get(key) == b"9"
    # Told to write the previous format (for a release that must stay possible to roll back), it
    # records that one over it or an earlier one, and refuses state already written in today's.
    previous = RedisStore(client, namespace=namespace, bucket_ms=BUCKET, horizon_ms=HORIZON, state_ttl_ms=HORIZON,
                          write_format=7)
    for earlier in (None, "5", "6", "7"):
        if earlier is None:
            raw.delete(key)
        else:
            raw.set(key, earlier)
        assert previous.adopt(config) is False
        assert raw.get(key) == b"7"
    raw.set(key, "8")
    with pytest.raises(ConfigError, match="set to write version 7"):
        previous.adopt(config)
    assert raw.get(key) == b"8"
    client.close()
    raw.close()


def test_a_partition_an_earlier_version_wrote_is_read_whole(redis_server: RedisServer) -> None:
    """A writer from before `aggchg` (a rolling upgrade) moves the offset and the sums but not the
    change index: a scrape must not trust its mark for that partition until it is read whole."""
    client, store, engine, messages = one_partition(redis_server, "upg", events=600, seed=9)
    epoch = store.claim("t:0")
    apply_batch(store, engine, "t:0", parsed(messages[:200]), epoch=epoch, next_offset=200)
    [first] = store.read_aggregates({}, since_bucket=0)
    assert first.mark is not None
    bucket = max(first.buckets)
    meta, agg = f"{{{store.namespace}:t:0}}:meta", f"{{{store.namespace}:t:0}}:agg:{bucket}"
    # What the earlier version's commit script did: sums and offset, nothing of aggchg/aggmark.
    segment, name = next(iter(first.buckets[bucket]))
    client.hincrbyfloat(agg, f"{segment}|{name}", 5)
    client.hset(meta, "offset", 250)
    [behind] = store.read_aggregates({"t:0": first.mark}, since_bucket=0)
    assert behind.whole and behind.mark is None
    assert behind.buckets[bucket][(segment, name)] == first.buckets[bucket][(segment, name)] + 5
    # This version's next commit finds the change index behind: a reader on an older mark reads whole.
    epoch = store.claim("t:0")
    apply_batch(store, engine, "t:0", parsed(messages[200:]), epoch=epoch, next_offset=600)
    [after] = store.read_aggregates({"t:0": first.mark}, since_bucket=0)
    assert after.whole and after.mark is not None and after.mark.split("/")[0] != first.mark.split("/")[0]
    [again] = store.read_aggregates({"t:0": after.mark}, since_bucket=0)
    assert not again.buckets
    client.close()


def test_a_whole_read_in_many_round_trips_reads_what_one_round_trip_does(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    client, store, engine, messages = one_partition(redis_server, "chunks", events=900, seed=10, rate=0.2)
    for number in range(3):
        epoch = store.claim(f"t:{number}")
        apply_batch(store, engine, f"t:{number}", parsed(messages[number * 300:(number + 1) * 300]), epoch=epoch,
                    next_offset=300)
    at_once = [(r.partition, r.mark, r.whole, r.buckets) for r in store.read_aggregates({}, since_bucket=0)]
    assert len(at_once) == 3 and all(len(buckets) > 2 for _, _, _, buckets in at_once)
    monkeypatch.setattr(redis_reads, "AGGREGATE_READ_BUCKETS", 2)
    round_trips: list[str] = []

    def counted(what: str) -> contextlib.nullcontext[None]:
        round_trips.append(what)
        return contextlib.nullcontext()

    monkeypatch.setattr(store, "_round_trip", counted)
    in_parts = [(r.partition, r.mark, r.whole, r.buckets) for r in store.read_aggregates({}, since_bucket=0)]
    assert in_parts == at_once
    assert round_trips.count("aggregate read") == 3
    client.close()


def test_a_query_state_without_judgments_expires_with_its_newest_bucket_under_the_wall_clock(
        redis_server: RedisServer) -> None:
    client = connect(redis_server.url)
    judgment_ttl = 30 * 86_400_000
    shown = b'{"type":"impression","impression_id":"%s","query_id":"%s","ts":%d,"results":["a","b"]}'
    judged = b'{"type":"judgment","query_id":"judged","doc_id":"a","grade":1,"ts":%d}'
    now = int(time.time() * 1000)
    ttls = {}
    for wall_clock in (True, False):
        # Format 6, whose query hash holds the groups (format 7's: tests/integration/test_compact_state.py).
        store = RedisStore(client, namespace=f"ttl-{uuid.uuid4().hex[:8]}", bucket_ms=BUCKET, horizon_ms=HORIZON,
                           state_ttl_ms=judgment_ttl, wall_clock=wall_clock, write_format=6)
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        epoch = store.claim("t:0")
        batch = parsed([shown % (b"1", b"shown", now), shown % (b"2", b"judged", now), judged % now])
        apply_batch(store, engine, "t:0", batch, epoch=epoch, next_offset=3, event_clock=not wall_clock)
        ttls[wall_clock] = {query: client.pttl(f"{{{store.namespace}:t:0}}:q:{query}") for query in ("shown", "judged")}
    # Under the wall clock (Redis's own), the state of a query never judged leaves with its newest
    # bucket, a horizon and a bucket from now at the most; under the event clock, which may run
    # slower than Redis's, it stays as long as a judged one, and a judged one always does.
    assert HORIZON + BUCKET - 5_000 < ttls[True]["shown"] <= HORIZON + BUCKET
    assert ttls[False]["shown"] > judgment_ttl - 5_000
    assert ttls[True]["judged"] > judgment_ttl - 5_000 and ttls[False]["judged"] > judgment_ttl - 5_000
    client.close()


def test_lists_written_by_format_1_and_again_by_format_2_add_up(redis_server: RedisServer) -> None:
    client = connect(redis_server.url)
    # Lists of groups of format 6 (format 7 keeps a group's lists with it).
    store = RedisStore(client, namespace=f"lists-{uuid.uuid4().hex[:8]}", bucket_ms=BUCKET, horizon_ms=HORIZON,
                       state_ttl_ms=HORIZON, wall_clock=False, write_format=6)
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
    epoch = store.claim("t:0")
    shown = b'{"type":"impression","impression_id":"%d","query_id":"q","ts":%d,"results":["b","a"]}'
    apply_batch(store, engine, "t:0", parsed([shown % (1, T0)]), epoch=epoch, next_offset=1)
    # What a release writing format 1 adds to the same hash, for the same list and another one.
    lists = f"{{{store.namespace}:t:0}}:lists:q:{T0 // BUCKET}"
    client.hincrby(lists, '["{}",["b","a"]]', 2)
    client.hincrby(lists, '["{}",["a"]]', 1)
    assert store.ranked_lists("t:0", "q") == {(T0 // BUCKET, "{}", ("b", "a")): 3, (T0 // BUCKET, "{}", ("a",)): 1}
    # Format 2 keeps a list in a few bytes: its documents' positions in the group.
    assert sorted(client.hkeys(lists)) == sorted([b'["{}",["b","a"]]', b'["{}",["a"]]', b"{}\x1f0,1"])
    client.close()


def test_states_the_byte_bound_evicts_are_read_back_and_every_ndcg_equals_the_replay(
        redis_server: RedisServer) -> None:
    client = connect(redis_server.url)
    store = RedisStore(client, namespace=f"evict-{uuid.uuid4().hex[:8]}", bucket_ms=BUCKET, horizon_ms=HORIZON,
                       state_ttl_ms=HORIZON, wall_clock=False, cache_bytes=EVICTING_BYTES)
    spec = SimulationSpec(events=3000, seed=21, queries=40, rate=20.0)
    messages = [v for _, v in Simulator(spec).messages()]
    engine, replay = Engine(MEASURE, BUCKET, horizon_ms=HORIZON), Replay(MEASURE, bucket_ms=BUCKET)
    epoch = store.claim("t:0")
    written: set[str] = set()
    read_back = 0
    for start in range(0, len(messages), 100):
        batch = parsed(messages[start:start + 100])
        # The queries this batch needs that were written before and are no longer cached: read from Redis.
        needed = {event.query_id for event in batch if not isinstance(event, InvalidEvent)}
        read_back += sum(1 for query_id in needed & written
                         if store._cache.get("t:0", query_id, time.monotonic()) is None)
        outcome = apply_batch(store, engine, "t:0", batch, epoch=epoch, next_offset=start + 100)
        written |= outcome.touched.keys()
        assert store._cache.bytes <= EVICTING_BYTES
        for message in messages[start:start + 100]:
            replay.add(message)
        expected = replay.summary()["k"]
        means = window_means(store.aggregates(), MEASURE.cutoffs)
        for k, row in expected.items():
            for name, value in row.items():
                if name not in OVER_QUERIES:
                    assert means[k][name] == pytest.approx(value, abs=1e-9), (start, k, name)
    # What the test is about happened: states left the cache for their bytes (not their groups),
    # were read back from Redis, and some stayed.
    assert store._cache.groups < store._cache.most_groups
    assert read_back > 100
    assert 0 < sum(1 for query_id in written if store._cache.get("t:0", query_id, time.monotonic())) < len(written)
    client.close()
