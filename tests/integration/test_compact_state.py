"""State format 7 on a real redis-server: a query's groups in a compact hash of their own, sized for
listpacks, expiring with the horizon; format 6 state continued in it, and state written in format 6
by a release told to (`state_format`) continued by the previous release's reader."""

from __future__ import annotations

import time
import uuid
from typing import Literal

import pytest
import redis

from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.engine import Engine
from stream_ndcg.errors import ConfigError
from stream_ndcg.metric import Measure
from stream_ndcg.state.base import StateStore
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.state.redis_reads import connect
from stream_ndcg.windows import window_means
from tests.support.batches import apply_batch, parsed
from tests.support.store_contract import BUCKET, HORIZON, MEASURE

pytestmark = pytest.mark.redis


def store_of(url: str, namespace: str, write_format: int, *, wall_clock: bool = False) -> RedisStore:
    return RedisStore(connect(url), namespace=namespace, bucket_ms=BUCKET, horizon_ms=HORIZON,
                      state_ttl_ms=30 * 86_400_000, write_format=write_format, wall_clock=wall_clock)


def test_a_tail_query_is_one_listpack_hash_without_lists_keys(redis_server: RedisServer) -> None:
    raw = redis.Redis.from_url(redis_server.url)
    store = store_of(redis_server.url, f"lp-{uuid.uuid4().hex[:8]}", 7, wall_clock=True)
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
    now = int(time.time() * 1000)
    shown = (b'{"type":"impression","impression_id":"%d","query_id":"%s","ts":%d,'
             b'"results":["doc-%d-a","doc-b","doc-c","doc-d","doc-e","doc-f","doc-g","doc-h","doc-i","doc-j"],'
             b'"segment":{"variant":"%s"}}')
    judged = b'{"type":"judgment","query_id":"judged","doc_id":"doc-b","grade":%d,"ts":%d}'
    batch = [shown % (n, b"judged" if n % 2 else b"shown", now + n, n % 3, b"AB"[n % 2:][:1]) for n in range(8)]
    apply_batch(store, engine, "t:0", parsed([*batch, judged % (2, now), judged % (3, now + 1)]),
                epoch=store.claim("t:0"), next_offset=10, event_clock=False, now_ms=now)
    tag = f"{{{store.namespace}:t:0}}"
    for query in ("shown", "judged"):
        groups = f"{tag}:g:{query}"
        assert raw.object("encoding", groups) == b"listpack"
        # The groups go with the horizon: their newest bucket's TTL, judged or not.
        assert 0 < raw.pttl(groups) <= HORIZON + BUCKET
        assert not list(raw.scan_iter(match=f"{tag}:lists:{query}:*"))
    # Only the judged query has a hash of its own: its judgments, for the judgment TTL.
    assert not raw.exists(f"{tag}:q:shown")
    assert raw.hkeys(f"{tag}:q:judged") == [b"r|doc-b"]
    assert raw.pttl(f"{tag}:q:judged") > 29 * 86_400_000
    shown_lists = store.ranked_lists("t:0", "shown")
    assert sum(shown_lists.values()) == 4
    assert {segment for _, segment, _ in shown_lists} == {'{"variant":"A"}'}
    raw.close()


@pytest.mark.parametrize("ideal", ["pool", "list"])
def test_format_6_state_is_continued_in_format_7_and_its_figures_equal_one_written_in_7(
        redis_server: RedisServer, ideal: Literal["pool", "list"]) -> None:
    """State written in format 6 (by the previous release, or this one told to) and then continued
    in format 7 holds the sums of a store that was written in format 7 throughout, and of the
    in-memory store; and format 7 state written by an instance told to write 6 is refused."""
    measure = Measure(cutoffs=MEASURE.cutoffs, ideal=ideal)
    messages = [v for _, v in Simulator(SimulationSpec(events=3000, seed=23, queries=40, rate=5.0)).messages()]
    namespace = f"up-{uuid.uuid4().hex[:8]}"
    before, after = store_of(redis_server.url, namespace, 6), store_of(redis_server.url, namespace, 7)
    throughout = store_of(redis_server.url, f"all-{uuid.uuid4().hex[:8]}", 7)
    memory = MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON)
    raw = redis.Redis.from_url(redis_server.url)
    for store in (before, throughout):
        store.adopt({"k": list(measure.cutoffs)})
    epochs = {id(store): store.claim("t:0") for store in (before, throughout, memory)}
    engine = Engine(measure, BUCKET, horizon_ms=HORIZON)
    half = 200 * (len(messages) // 400)
    for start in range(0, len(messages), 200):
        chunk = parsed(messages[start:start + 200])
        if start == half:
            # Format 6 holds the groups in the query's hash, and their lists in the buckets'.
            assert raw.keys(f"{{{namespace}:t:0}}:lists:*") and not raw.keys(f"{{{namespace}:t:0}}:g:*")
            # The upgrade: the new instance records its format and claims the partition.
            after.adopt({"k": list(measure.cutoffs)})
            epochs[id(after)] = after.claim("t:0")
        writer = before if start < half else after
        stores: tuple[StateStore, ...] = (writer, throughout, memory)
        for target in stores:
            apply_batch(target, engine, "t:0", chunk, epoch=epochs[id(target)], next_offset=start + 200)
    # The groups the second half changed moved to the compact hashes.
    assert raw.keys(f"{{{namespace}:t:0}}:g:*")
    reference = window_means(memory.aggregates(), measure.cutoffs)
    for store in (after, throughout):
        ours = window_means(store.aggregates(), measure.cutoffs)
        assert ours.keys() == reference.keys()
        for k, row in reference.items():
            for name, value in row.items():
                assert ours[k][name] == pytest.approx(value, abs=1e-9), (k, name)
    for query in {f"q{n}" for n in range(40)}:
        assert after.ranked_lists("t:0", query) == throughout.ranked_lists("t:0", query), query
    # What it wrote is format 7: the instance told to write 6 (a rollback too late) refuses it.
    assert before.recorded_config()[1] == "7"
    with pytest.raises(ConfigError, match="set to write version 6"):
        before.adopt({"k": list(measure.cutoffs)})
    raw.close()
