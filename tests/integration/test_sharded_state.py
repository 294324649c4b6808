"""State format 8 on a real redis-server: drill-down rows and impression ids in listpack-sized shards
that the commit script grows, read as the in-memory store holds them; and format 7's rows and ids
continued in them."""

from __future__ import annotations

import uuid

import pytest
import redis

from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.engine import Engine
from stream_ndcg.rows import Row
from stream_ndcg.state import shard_format
from stream_ndcg.state.base import StateStore
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.state.redis_reads import connect
from stream_ndcg.state.shard_format import name_hash, shard_of
from tests.support.batches import apply_batch, parsed
from tests.support.store_contract import BUCKET, DEDUP_HORIZON, HORIZON, MEASURE, T0

pytestmark = pytest.mark.redis

# More distinct queries in one bucket than one listpack hash holds fields (128 by default).
QUERIES = 600


def store_of(url: str, namespace: str, write_format: int) -> RedisStore:
    return RedisStore(connect(url), namespace=namespace, bucket_ms=BUCKET, horizon_ms=HORIZON,
                      state_ttl_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON, wall_clock=False,
                      write_format=write_format)


def impressions(first: int, count: int) -> list[bytes]:
    """One impression of each of `count` queries, a segment each of two, ids numbered from `first`."""
    shown = (b'{"type":"impression","impression_id":"id-%d","query_id":"q%d","ts":%d,'
             b'"results":["a%d","b","c","d","e","f","g","h","i","j"],"segment":{"variant":"%s"}}')
    return [shown % (n, n % QUERIES, T0 + n, n % 7, b"AB"[n % 2:][:1]) for n in range(first, first + count)]


def rows_of(store: StateStore) -> dict[tuple[int, str, str], Row]:
    return {(bucket, segment, query): row for bucket, segment, query, row in store.read_rows("t:0", None, 0).rows}


def written(stores: tuple[StateStore, ...], batches: list[list[bytes]], engine: Engine,
            epochs: dict[int, str], offset: int = 0) -> int:
    for batch in batches:
        offset += len(batch)
        for store in stores:
            apply_batch(store, engine, "t:0", parsed(batch), epoch=epochs[id(store)], next_offset=offset)
    return offset


def test_rows_and_ids_of_format_8_are_listpack_shards_read_as_the_memory_store_holds_them(
        redis_server: RedisServer) -> None:
    raw = redis.Redis.from_url(redis_server.url)
    store = store_of(redis_server.url, f"sh-{uuid.uuid4().hex[:8]}", 8)
    memory = MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON)
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON)
    epochs = {id(s): s.claim("t:0") for s in (store, memory)}
    events = impressions(0, QUERIES)
    offset = written((store, memory), [events[i:i + 200] for i in range(0, QUERIES, 200)], engine, epochs)
    tag = f"{{{store.namespace}:t:0}}"
    directory = raw.hgetall(f"{tag}:rowdir:{T0 // BUCKET}")
    shards = int(directory[b"n"])
    # Grown past one shard, each a listpack, each row in the shard of its query.
    assert shards > 1
    row_keys: list[bytes] = list(raw.keys(f"{tag}:rows:*"))  # type: ignore[arg-type]
    for key in row_keys:
        assert raw.object("encoding", key) == b"listpack", key
        index = int(key.rpartition(b":")[2])
        names: list[bytes] = list(raw.hkeys(key))  # type: ignore[arg-type]
        assert all(shard_of(name.partition(b"|")[2].decode(), shards) == index for name in names)
        assert all(len(value) <= 64 for value in raw.hvals(key))
    id_keys = raw.keys(f"{tag}:ids:*")
    assert len(id_keys) > 1 and sum(raw.hlen(key) for key in id_keys) == QUERIES
    for id_key in [*id_keys, f"{tag}:rowdir:{T0 // BUCKET}", f"{tag}:iddir"]:
        assert raw.object("encoding", id_key) == b"listpack", id_key
    assert not raw.exists(f"{tag}:imp") and not raw.exists(f"{tag}:rows:{T0 // BUCKET}")
    assert rows_of(store) == rows_of(memory) and len(rows_of(memory)) == QUERIES
    # Every id sent again is a duplicate, in both stores alike.
    again = [apply_batch(s, engine, "t:0", parsed(events[:300]), epoch=epochs[id(s)], next_offset=offset + 300)
             for s in (store, memory)]
    assert [outcome.counts["duplicate:impression"] for outcome in again] == [300, 300]
    raw.close()


def test_a_batch_hashes_each_impression_id_once_and_its_commit_stores_it_in_that_hash_s_shard(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The load looks each id up with its `name_hash` and the commit sends the same hash on, not
    found again: every id of a batch hashed once, each stored in the shard its hash names."""
    raw = redis.Redis.from_url(redis_server.url)
    store = store_of(redis_server.url, f"once-{uuid.uuid4().hex[:8]}", 8)
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON)
    hashed: list[str] = []

    def counted(name: str) -> int:
        hashed.append(name)
        return name_hash(name)

    monkeypatch.setattr(shard_format, "name_hash", counted)
    outcome = apply_batch(store, engine, "t:0", parsed(impressions(0, QUERIES)), epoch=store.claim("t:0"),
                          next_offset=QUERIES)
    ids = [f"id-{n}" for n in range(QUERIES)]
    assert len(outcome.impression_buckets) == QUERIES
    assert sorted(name for name in hashed if name.startswith("id-")) == sorted(ids)
    tag = f"{{{store.namespace}:t:0}}"
    id_keys: list[bytes] = list(raw.keys(f"{tag}:ids:*"))  # type: ignore[arg-type]
    assert len(id_keys) > 1
    stored: list[str] = []
    for key in id_keys:
        slot, _, index = key.decode().removeprefix(f"{tag}:ids:").partition(":")
        count = int(raw.hget(f"{tag}:iddir", slot))  # type: ignore[arg-type]
        held: list[bytes] = list(raw.hkeys(key))  # type: ignore[arg-type]
        assert all(name_hash(i.decode()) % count == int(index) for i in held), key
        stored += [i.decode() for i in held]
    assert sorted(stored) == sorted(ids)
    raw.close()


def test_rows_and_ids_of_format_7_are_continued_in_format_8(redis_server: RedisServer) -> None:
    """Format 7 writes the first half (its rows in one hash a bucket, its ids in a sorted set),
    format 8 the second: the rows read are the in-memory store's, each once, and the ids of the
    first half are still duplicates."""
    raw = redis.Redis.from_url(redis_server.url)
    namespace = f"up8-{uuid.uuid4().hex[:8]}"
    before, after = store_of(redis_server.url, namespace, 7), store_of(redis_server.url, namespace, 8)
    memory = MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON)
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON)
    epochs = {id(s): s.claim("t:0") for s in (before, memory)}
    first = impressions(0, QUERIES)
    offset = written((before, memory), [first[:300], first[300:]], engine, epochs)
    tag = f"{{{namespace}:t:0}}"
    old_rows = f"{tag}:rows:{T0 // BUCKET}"
    assert raw.hlen(old_rows) == QUERIES and raw.zcard(f"{tag}:imp") == QUERIES
    epochs[id(after)] = after.claim("t:0")
    # The queries of the first 200 again, in the same bucket: their rows move to format 8.
    second = impressions(QUERIES, 200)
    outcome = apply_batch(after, engine, "t:0", parsed([*second, *first[:100]]), epoch=epochs[id(after)],
                          next_offset=offset + 300)
    apply_batch(memory, engine, "t:0", parsed([*second, *first[:100]]), epoch=epochs[id(memory)],
                next_offset=offset + 300)
    assert outcome.counts["duplicate:impression"] == 100
    assert raw.hlen(old_rows) == QUERIES - 200
    assert rows_of(after) == rows_of(memory)
    raw.close()


def expiry_times(raw: redis.Redis, keys: list[bytes]) -> dict[bytes, int]:
    """Each key's expiry time (PEXPIRETIME: ms of the server's clock; -1 none)."""
    return {key: int(raw.execute_command("PEXPIRETIME", key)) for key in keys}  # type: ignore[no-untyped-call]


def test_no_shard_expires_before_its_reference_and_a_commit_re_expires_only_the_shards_it_creates(
        redis_server: RedisServer) -> None:
    """The commit script's expiry rule (`shard_scripts.SHARD`): after every commit each shard of a
    bucket's rows expires no sooner than the bucket's directory, and each shard of a slot of ids no
    sooner than the slot's time in the ids' directory, those at least a horizon ahead; a new bucket
    starts at the shard count of the one before, its shards created by later commits expire too,
    and a commit that creates no shard re-expires no shard."""
    raw = redis.Redis.from_url(redis_server.url)
    store = store_of(redis_server.url, f"ex-{uuid.uuid4().hex[:8]}", 8)
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON)
    epochs = {id(store): store.claim("t:0")}
    tag = f"{{{store.namespace}:t:0}}"
    first, second = T0 // BUCKET, T0 // BUCKET + 1
    offset = written((store,), [impressions(0, 300), impressions(300, 300)], engine, epochs)
    grown = int(raw.hget(f"{tag}:rowdir:{first}", "n") or 0)
    assert grown > 2
    # The next bucket: a few queries (its directory new), then many more, whose shards did not exist.
    later = [event.replace(b'"ts":%d' % (T0 + n), b'"ts":%d' % (T0 + BUCKET + n))
             for n, event in zip(range(600, 1200), impressions(600, 600), strict=True)]
    offset = written((store,), [later[:3], later[3:]], engine, epochs, offset)
    assert int(raw.hget(f"{tag}:rowdir:{second}", "n") or 0) == grown

    def check() -> None:
        now = int(raw.time()[0]) * 1000
        for bucket in (first, second):
            directory = expiry_times(raw, [f"{tag}:rowdir:{bucket}".encode()])
            reference = next(iter(directory.values()))
            assert reference - now >= HORIZON
            shards = expiry_times(raw, list(raw.keys(f"{tag}:rows:{bucket}:*")))  # type: ignore[arg-type]
            assert len(shards) > 2 and all(at >= reference for at in shards.values()), (bucket, shards, reference)
        ids: dict[bytes, bytes] = raw.hgetall(f"{tag}:iddir")  # type: ignore[assignment]
        slots = [field for field in ids if field.endswith(b":x")]
        assert slots
        for slot in slots:
            reference = int(ids[slot])
            assert reference - now >= HORIZON
            shards = expiry_times(raw, list(raw.keys(f"{tag}:ids:{slot[:-2].decode()}:*")))  # type: ignore[arg-type]
            assert shards and all(at >= reference for at in shards.values()), (slot, shards, reference)

    check()
    # One more impression of a query already held: its shards all exist and the references are far enough.
    expired_before = raw.info("commandstats").get("cmdstat_pexpire", {}).get("calls", 0)
    written((store,), [[later[10].replace(b'"id-610"', b'"id-again"')]], engine, epochs, offset)
    expired = raw.info("commandstats")["cmdstat_pexpire"]["calls"] - expired_before
    check()
    assert expired < grown, expired
    raw.close()
