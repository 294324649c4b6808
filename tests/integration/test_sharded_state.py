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
from stream_ndcg.state.base import StateStore
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.state.redis_reads import connect
from stream_ndcg.state.shard_format import shard_of
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
