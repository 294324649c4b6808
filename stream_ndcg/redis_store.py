"""The Redis store: the key layout, and each batch committed atomically with its offset.

(Over 350 lines on purpose: the key layout, the Lua scripts and the code that builds their
KEYS and ARGV must be read together, or a key added to one is missed in the other.)

Key layout (``ns`` is the namespace setting, followed by ``#<generation>`` once
the state has been rebuilt for a new metric configuration; ``{ns:P}`` is a Redis
Cluster hash tag, so that everything of one input partition P =
``topic:partition`` lives in one slot and one script can write it atomically):

    {ns}:config                STRING  the metric configuration the state is built with (JSON)
    {ns}:format                STRING  `state_format.FORMAT_VERSION` of the stored state (absent: 1)
    {ns}:generation            STRING  how many times it was rebuilt; the keys of earlier
                                       generations expire, or are a few small keys per partition
    ns:partitions              SET     every partition ever claimed (for scrapes)
    ns:segment:<label>         SET     the admitted values of a segment label (at most the cap)
    {ns:P}:epoch               STRING  fencing token: a random one per claim, so that even a Redis
                                       rolled back by its AOF never hands out the same token twice
    {ns:P}:meta                HASH    offset (next to consume), clock (the engine's clock at the last
                                       commit: greatest event time, or wall time with --clock wall),
                                       rowseq (how many row log entries were ever written),
                                       aggmark (the offset its last commit wrote aggchg up to) and
                                       aggepoch (counts the times aggchg missed commits: see below)
    {ns:P}:counts              HASH    event counts: impression, judgment, duplicate:*, rejected:*
    {ns:P}:q:<query_id>        HASH    the query's state (fields: `state_format`), TTL max(horizon,
                                       judgment TTL); without judgments, under the wall clock, its
                                       newest bucket's TTL
    {ns:P}:lists:<query_id>:<bucket>  HASH  the query's ranked lists, as positions in their groups
                                       (`state_format`), TTL horizon
    {ns:P}:imp                 ZSET    impression ids applied, scored by the bucket each is remembered
                                       from (`Engine._impression`); pruned behind the dedup horizon
    {ns:P}:agg:<bucket>        HASH    aggregate sums (`state_format`), TTL horizon
    {ns:P}:aggidx              ZSET    the buckets that have an agg hash
    {ns:P}:aggchg              ZSET    the same buckets, scored by the next offset of the commit
                                       that last changed them: a scrape reads the buckets changed
                                       since the offset it read last (`read_aggregates`). A commit
                                       that finds aggmark behind the stored offset (a writer of an
                                       earlier version committed without aggchg) bumps aggepoch,
                                       and a reader that sees it move reads the partition whole
    {ns:P}:rows:<bucket>       HASH    drill-down rows (`state_format`), TTL horizon
    {ns:P}:rowlog              STREAM  the rows of each commit (one entry: n its rowseq, r JSON
                                       [[bucket, field, value]...]), trimmed to the last
                                       ROW_LOG_MS, so that a drill-down reader reads what changed;
                                       written only while a reader holds the lease below
    {ns:P}:reader              STRING  a drill-down reader's lease, READER_LEASE_MS: nobody reading,
                                       no log (a reader back later reads the rows whole)

A batch costs two round trips: one pipelined read (query states, impression
ids, clock) and one script call per partition that checks the epoch and the
expected offset and writes states, lists, impression ids, aggregate
increments, counts, the clock and the next offset, all or nothing.

The same code runs on one server and on a Redis Cluster (``connect(...,
cluster=True)``): every script names all its keys and they share one slot, the
two global sets are single-key commands, and scripts go as EVAL, which the
cluster pipeline routes by key (it refuses EVALSHA) and which no node can
answer with NOSCRIPT after a restart or failover.

Only the instance holding a partition writes it, so that instance keeps the
query states it wrote in a `StateCache` and reads from Redis only the states
it has not got. The cache of a partition is dropped on every claim and on
every failed commit; the offset check makes a stale cache impossible to write
(a Redis that lost its last second would refuse the next commit).

Longer than the 350 lines a module is held to: the key layout, the two
scripts that write it and the round trips that read it are one piece of
knowledge; what they store is `state_format`'s, when it expires `windows`'s,
and the cache is `state_cache`'s.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson
import redis
from redis.exceptions import MovedError, RedisClusterException, RedisError

from stream_ndcg import reconfigure, state_format
from stream_ndcg.engine import QueryState
from stream_ndcg.errors import ConfigError, FencedError, StoreUnavailable
from stream_ndcg.state_cache import StateCache
from stream_ndcg.store import AggregateRead, Commit, CommitInFlight, RowRead, Snapshot
from stream_ndcg.vocabulary import AggregateKey
from stream_ndcg.windows import bucket_ttl_ms, oldest_kept_bucket

logger = logging.getLogger(__name__)

# How many buckets' sums one round trip of `read_aggregates` asks for (a bucket is tens of sums).
AGGREGATE_READ_BUCKETS = 1000
# How long the row log keeps a commit's rows: a drill-down reader that comes back later than this
# reads the partition's rows whole again.
ROW_LOG_MS = 120_000
# How long the row log is written after the last drill-down read: an open page refreshes well within it.
READER_LEASE_MS = 600_000

_COMMIT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[2], 'offset') ~= (ARGV[3] ~= '' and ARGV[3] or false) then return -1 end
local p = cjson.decode(ARGV[2])
if redis.call('HGET', KEYS[2], 'aggmark') ~= (ARGV[3] ~= '' and ARGV[3] or false) then
  redis.call('HINCRBY', KEYS[2], 'aggepoch', 1)
end
for _, s in ipairs(p.states) do
  for i = 1, #s[3], 200 do redis.call('HSET', KEYS[s[1]], unpack(s[3], i, math.min(i + 199, #s[3]))) end
  for i = 1, #s[4], 200 do redis.call('HDEL', KEYS[s[1]], unpack(s[4], i, math.min(i + 199, #s[4]))) end
  for _, a in ipairs(s[5]) do
    local held = redis.call('HGET', KEYS[s[1]], a[1])
    local list = held and (string.sub(held, 1, -2) .. ',' .. a[2] .. ']') or ('[' .. a[2] .. ']')
    redis.call('HSET', KEYS[s[1]], a[1], list)
  end
  redis.call('PEXPIRE', KEYS[s[1]], s[2])
end
for _, s in ipairs(p.lists) do
  for _, f in ipairs(s[3]) do redis.call('HINCRBY', KEYS[s[1]], f[1], f[2]) end
  redis.call('PEXPIRE', KEYS[s[1]], s[2])
end
for i = 1, #p.impressions, 500 do
  redis.call('ZADD', KEYS[5], unpack(p.impressions, i, math.min(i + 499, #p.impressions)))
end
if #p.impressions > 0 then redis.call('PEXPIRE', KEYS[5], p.imp_ttl) end
for _, a in ipairs(p.aggs) do
  for _, f in ipairs(a[4]) do redis.call('HINCRBYFLOAT', KEYS[a[1]], f[1], f[2]) end
  redis.call('PEXPIRE', KEYS[a[1]], a[2])
  redis.call('ZADD', KEYS[4], a[3], a[3])
  redis.call('ZADD', KEYS[8], p.offset, a[3])
end
for _, r in ipairs(p.rows) do
  for i = 1, #r[3], 200 do redis.call('HSET', KEYS[r[1]], unpack(r[3], i, math.min(i + 199, #r[3]))) end
  redis.call('PEXPIRE', KEYS[r[1]], r[2])
end
if #p.rows > 0 then
  local n = redis.call('HINCRBY', KEYS[2], 'rowseq', 1)
  if redis.call('EXISTS', KEYS[7]) == 1 then
    local now = redis.call('TIME')
    local oldest = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(p.row_log_ms)
    local logged = {}
    for _, r in ipairs(p.rows) do
      for i = 1, #r[3], 2 do logged[#logged + 1] = {r[4], r[3][i], r[3][i + 1]} end
    end
    redis.call('XADD', KEYS[6], 'MINID', '~', string.format('%d', oldest), '*', 'n', n, 'r', cjson.encode(logged))
    redis.call('PEXPIRE', KEYS[6], p.row_log_ms * 2)
  end
end
for _, c in ipairs(p.counts) do redis.call('HINCRBY', KEYS[3], c[1], c[2]) end
redis.call('HSET', KEYS[2], 'offset', p.offset, 'aggmark', p.offset)
if p.clock ~= cjson.null then
  local old = redis.call('HGET', KEYS[2], 'clock')
  if not old or tonumber(old) < tonumber(p.clock) then redis.call('HSET', KEYS[2], 'clock', p.clock) end
end
if p.prune ~= cjson.null then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. p.prune)
  for i = 1, #gone, 500 do redis.call('ZREM', KEYS[8], unpack(gone, i, math.min(i + 499, #gone))) end
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. p.prune)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. p.forget)
end
return 1
"""

# Records the configuration `adopt` decided on, unless another instance recorded one since it
# read (it then reads and decides again): KEYS config, generation, format; ARGV the configuration
# to record, the one read ('' for none), '1' to start a new generation, the format version to
# record, the versions this release reads (comma-separated).
_ADOPT = """
local format = redis.call('GET', KEYS[3])
if format and not string.find(',' .. ARGV[5] .. ',', ',' .. format .. ',', 1, true) then return {-2, format} end
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[2] then return {-1, ''} end
redis.call('SET', KEYS[3], ARGV[4])
redis.call('SET', KEYS[1], ARGV[1])
if ARGV[3] == '1' then return {redis.call('INCR', KEYS[2]), ''} end
return {tonumber(redis.call('GET', KEYS[2]) or '0'), ''}
"""

_ADMIT = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) then redis.call('SADD', KEYS[1], ARGV[1]) return 1 end
return 0
"""


Client = redis.Redis | redis.RedisCluster


def connect(url: str, *, cluster: bool = False, ca_file: str = "") -> Client:
    """A client for one server, or for a cluster discovered from the node in `url`.

    A client for one server connects on its first command; a cluster client asks for the
    slot map at once, so an unreachable cluster raises StoreUnavailable here (hand the
    store a factory to defer that to the first round trip, where the loop backs off).
    """
    options: dict[str, Any] = {"socket_timeout": 10, "socket_connect_timeout": 5, "health_check_interval": 30}
    if ca_file:
        options["ssl_ca_certs"] = ca_file
    if not cluster:
        return redis.Redis.from_url(url, **options)
    try:
        return redis.RedisCluster.from_url(url, **options)
    except (RedisError, RedisClusterException) as exc:
        raise StoreUnavailable(f"Redis Cluster unreachable: {type(exc).__name__}: {exc}") from exc


class RedisStore:
    """The `StateStore` on one Redis server or a Redis Cluster; `client` may be a factory,
    called at the first round trip and again after each failed attempt to connect.

        store = RedisStore(lambda: connect(url, cluster=True), namespace="sndcg",
                           bucket_ms=60_000, horizon_ms=87_000_000, state_ttl_ms=2_592_000_000)
    """

    def __init__(
        self,
        client: Client | Callable[[], Client],
        *,
        namespace: str,
        bucket_ms: int,
        horizon_ms: int,
        state_ttl_ms: int,
        dedup_horizon_ms: int | None = None,
        wall_clock: bool = True,
        cache_groups: int = 20_000,
        observe_round_trip: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self._client = client if isinstance(client, redis.Redis | redis.RedisCluster) else None
        self._connect = client if callable(client) else lambda: client
        self.namespace = namespace
        # Where this instance's keys live: the namespace, and a generation after each rebuild.
        self._space = namespace
        self._cache = StateCache(cache_groups)
        self.bucket_ms = bucket_ms
        self.horizon_ms = horizon_ms
        self.state_ttl_ms = max(state_ttl_ms, horizon_ms)
        # Impression ids are forgotten behind this (None: the horizon).
        self.dedup_horizon_ms = dedup_horizon_ms or horizon_ms
        self.wall_clock = wall_clock
        self._observe = observe_round_trip
        self._admitted: dict[tuple[str, str], bool] = {}

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self._connect()
        return self._client

    @contextmanager
    def _round_trip(self, what: str, forget: Collection[str] = (), *, observe: bool = True,
                    earlier_s: float = 0.0) -> Iterator[None]:
        """Time a round trip, and make a Redis error a StoreUnavailable that drops the cached states
        of the partitions to `forget`. A round trip in two halves (`begin_commit`) is observed once,
        at the second, with the seconds of the first (`earlier_s`)."""
        started = time.perf_counter()
        try:
            yield
        except (RedisError, RedisClusterException) as exc:
            for partition in forget:
                self._cache.forget(partition)
            hint = " (a cluster node answered: set redis_cluster)" if isinstance(exc, MovedError) else ""
            raise StoreUnavailable(f"Redis {what} failed: {type(exc).__name__}: {exc}{hint}") from exc
        finally:
            if observe:
                self._observe(earlier_s + time.perf_counter() - started)

    def _key(self, partition: str, *parts: object) -> str:
        return ":".join([f"{{{self._space}:{partition}}}", *map(str, parts)])

    def adopt(self, config: Mapping[str, object], *, rebuild: bool = False) -> bool:
        keys = self._config_keys()
        # Another instance that records a configuration between the read and the write makes the
        # write fail: read it and decide again (it is most likely the same decision).
        for _ in range(10):
            held_text, found_format = self._read_config()
            state_format.check_format(found_format)
            record, rebuilt = reconfigure.decide(orjson.loads(held_text) if held_text else None, config,
                                                 rebuild=rebuild)
            wanted = held_text if record is None else orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()
            with self._round_trip("configuration record"):
                generation, found = self.client.eval(_ADOPT, 3, *keys, wanted, held_text, "1" if rebuilt else "0",
                                                     str(state_format.FORMAT_VERSION),
                                                     ",".join(state_format.READABLE_FORMATS))
            if generation == -2:
                state_format.check_format(_text(found))
            if generation >= 0:
                break
        else:
            raise ConfigError("the recorded metric configuration kept changing while this instance started: "
                              "are instances with different configurations starting together?")
        self._space = self.namespace if generation == 0 else f"{self.namespace}#{generation}"
        self._cache.forget_all()
        self._admitted.clear()
        return rebuilt

    def follow(self) -> bool:
        _, generation_key, _ = self._config_keys()
        with self._round_trip("generation read"):
            generation = int(self.client.get(generation_key) or 0)
        space = self.namespace if generation == 0 else f"{self.namespace}#{generation}"
        moved, self._space = space != self._space, space
        return moved

    def recorded_config(self) -> tuple[dict[str, object] | None, str | None]:
        held, found_format = self._read_config()
        return (orjson.loads(held) if held else None), found_format

    def _read_config(self) -> tuple[str, str | None]:
        """The recorded configuration as stored ('' for none), and the format version."""
        config_key, _, format_key = self._config_keys()
        with self._round_trip("configuration read"):
            held, found_format = self.client.get(config_key), self.client.get(format_key)
        return ("" if held is None else _text(held)), (None if found_format is None else _text(found_format))

    def _config_keys(self) -> list[str]:
        return [f"{{{self.namespace}}}:{name}" for name in ("config", "generation", "format")]

    def claim(self, partition: str) -> str:
        self._cache.forget(partition)
        with self._round_trip("claim"):
            epoch = uuid.uuid4().hex
            self.client.set(self._key(partition, "epoch"), epoch)
            self.client.sadd(f"{self._space}:partitions", partition)
        return epoch

    def next_offset(self, partition: str) -> int | None:
        with self._round_trip("offset read"):
            value = self.client.hget(self._key(partition, "meta"), "offset")
        return int(value) if value is not None else None

    def load(self, partition: str, query_ids: Collection[str], impressions: Mapping[str, int]) -> Snapshot:
        states: dict[str, QueryState] = {}
        now = time.monotonic()
        for query_id in query_ids:
            cached = self._cache.get(partition, query_id, now)
            if cached is not None:
                states[query_id] = cached
        queries = [q for q in query_ids if q not in states]
        ids = list(impressions)
        with self._round_trip("load"):
            pipe = self.client.pipeline(transaction=False)
            for query_id in queries:
                pipe.hgetall(self._key(partition, "q", query_id))
            if ids:
                pipe.zmscore(self._key(partition, "imp"), ids)
            pipe.hget(self._key(partition, "meta"), "clock")
            replies = pipe.execute()
        for query_id, fields in zip(queries, replies[: len(queries)], strict=True):
            if fields:
                states[query_id] = state_format.state_from_fields(fields)
        known = {i: int(score) for i, score in zip(ids, replies[len(queries)], strict=True)
                 if score is not None} if ids else {}
        clock = replies[-1]
        return Snapshot(states, known, int(clock) if clock is not None else None)

    def commit(self, commits: Collection[Commit]) -> None:
        if commits:
            self._send(commits, overlap=False).finish()

    def begin_commit(self, commits: Collection[Commit]) -> CommitInFlight:
        """The commit scripts sent on a connection of their own, their replies read by `finish()`:
        the caller goes on (polling the next batch from Kafka) while Redis runs them. On a cluster
        they are sent when finished, as `commit` sends them."""
        return self._send(commits, overlap=True)

    def _send(self, commits: Collection[Commit], *, overlap: bool) -> _RedisCommit:
        # Before the scripts run: the TTLs they set start later, so a cached state is trusted less long.
        written = time.monotonic()
        prepared = [self._payload(commit) for commit in commits]
        ttls = [state_ttls for _, _, state_ttls in prepared]
        scripts = [("EVAL", _COMMIT, len(keys), *keys, commit.epoch, payload,
                    "" if commit.expected_offset is None else str(commit.expected_offset))
                   for commit, (keys, payload, _) in zip(commits, prepared, strict=True)]
        client = self.client
        if not overlap or not isinstance(client, redis.Redis):
            return _RedisCommit(self, list(commits), ttls, written, functools.partial(_executed, client, scripts))
        started = time.perf_counter()
        with self._round_trip("commit", forget=[commit.partition for commit in commits], observe=False):
            read = _sent(client.connection_pool, scripts)
        return _RedisCommit(self, list(commits), ttls, written, read, sending_s=time.perf_counter() - started)

    def _payload(self, commit: Commit) -> tuple[list[str], str, dict[str, int]]:
        """The commit script's keys and payload, and the TTL it gives each query state."""
        partition, outcome = commit.partition, commit.outcome
        keys = [self._key(partition, name) for name in ("epoch", "meta", "counts", "aggidx", "imp", "rowlog", "reader",
                                                              "aggchg")]

        def index(key: str) -> int:
            keys.append(key)
            return len(keys)  # Lua counts from 1

        clock = outcome.clock_ms
        now = time.time() * 1000 if self.wall_clock else clock

        def ttl(bucket: int) -> int:
            return bucket_ttl_ms(bucket, now, self.horizon_ms, self.bucket_ms)

        states = []
        state_ttls: dict[str, int] = {}
        for query_id, state in outcome.touched.items():
            query_change = outcome.changes[query_id]
            written, removed, appended = state_format.changed_fields(state, query_change)
            # Judgments outlive the query's last event by the judgment TTL. A state without any
            # holds only groups, which all fall behind the horizon with its newest bucket: the
            # engine would drop them at the query's next event, and Redis drops them unasked (a
            # query shown once would otherwise hold its groups for the judgment TTL). Only under
            # the wall clock, which Redis's TTLs count in: an event clock may run slower.
            grouped_only = self.wall_clock and not state.revisions
            state_ttl = state_ttls[query_id] = (max(map(ttl, (b for b, _ in state.groups)), default=1)
                                                if grouped_only else self.state_ttl_ms)
            states.append([index(self._key(partition, "q", query_id)), state_ttl, written, removed, appended])

        lists = [[index(self._key(partition, "lists", q, b)), ttl(b), fields]
                 for (q, b), fields in state_format.list_increments(outcome).items()]
        impressions = [item for impression_id, bucket in outcome.impression_buckets.items()
                       for item in (str(bucket), impression_id)]
        aggs = [[index(self._key(partition, "agg", b)), ttl(b), str(b), fields]
                for b, fields in state_format.aggregate_increments(outcome).items()]
        # The script logs the rows itself while a reader holds the lease: they cross the network once.
        rows = [[index(self._key(partition, "rows", b)), ttl(b), fields, b]
                for b, fields in state_format.row_writes(outcome).items()]
        prune = str(oldest_kept_bucket(now, self.horizon_ms, self.bucket_ms)) if now is not None else None
        forget = str(oldest_kept_bucket(now, self.dedup_horizon_ms, self.bucket_ms)) if now is not None else None
        payload = {
            "states": states, "lists": lists, "impressions": impressions, "aggs": aggs, "rows": rows,
            "row_log_ms": ROW_LOG_MS,
            "counts": [[name, n] for name, n in outcome.counts.items()],
            # The horizon's TTL, not the dedup horizon's: `forget` prunes by the clock, and under
            # the event clock a pause in traffic must not expire ids the clock still remembers.
            "imp_ttl": max(map(ttl, outcome.impression_buckets.values()), default=0),
            "offset": str(commit.next_offset), "clock": str(clock) if clock is not None else None, "prune": prune,
            "forget": forget,
        }
        return keys, orjson.dumps(payload).decode(), state_ttls

    def ranked_lists(self, partition: str, query_id: str) -> dict[tuple[int, str, tuple[str, ...]], int]:
        with self._round_trip("list read"):
            fields = self.client.hgetall(self._key(partition, "q", query_id))
            groups = state_format.state_from_fields(fields).groups if fields else {}
            buckets = sorted({b for b, _ in groups})
            pipe = self.client.pipeline(transaction=False)
            for bucket in buckets:
                pipe.hgetall(self._key(partition, "lists", query_id, bucket))
            replies = pipe.execute()
        held: dict[tuple[int, str, tuple[str, ...]], int] = {}
        documents: dict[int, dict[str, list[str]]] = {}
        for (bucket, segment), group in groups.items():
            documents.setdefault(bucket, {})[segment] = list(group.ranks)
        for bucket, reply in zip(buckets, replies, strict=True):
            for raw_field, count in reply.items():
                listed = state_format.decode_list_field(raw_field, documents[bucket])
                if listed is not None:
                    # A list written by format 1 and again by 2 is two fields.
                    key = (bucket, *listed)
                    held[key] = held.get(key, 0) + int(count)
        return held

    def read_rows(self, partition: str, cursor: str | None, since_bucket: int) -> RowRead:
        # A cursor is "<entry id>/<rowseq>" of the last entry read: the entries after it must carry
        # rowseq + 1, + 2... up to the count, or rows were written that the log does not hold
        # (trimmed, or written while no reader held the lease).
        log, meta, lease = (self._key(partition, name) for name in ("rowlog", "meta", "reader"))
        if cursor is not None:
            last_id, _, seen = cursor.partition("/")
            with self._round_trip("row log read"):
                pipe = self.client.pipeline(transaction=False)
                pipe.set(lease, 1, px=READER_LEASE_MS)
                # The count first: a commit landing between the two reads adds an entry, never a gap.
                pipe.hget(meta, "rowseq")
                pipe.xrange(log, min=f"({last_id}")
                _, written, entries = pipe.execute()
            numbers = [int(values[b"n"]) for _, values in entries]
            # Every entry since the cursor, none missing, up to the count read first.
            if (numbers == list(range(int(seen) + 1, int(seen) + 1 + len(numbers)))
                    and (numbers[-1] if numbers else int(seen)) >= int(written or 0)):
                rows = [(bucket, *state_format.decode_row_field(field), state_format.decode_row(value))
                        for _, values in entries for bucket, field, value in orjson.loads(values[b"r"])]
                return RowRead(_log_cursor(entries[-1]) if entries else cursor, False, rows)
        with self._round_trip("row read"):
            # The lease and the log's end first: every commit after them is logged, and rows read
            # after them are at least as new (reading one again is harmless).
            pipe = self.client.pipeline(transaction=False)
            pipe.set(lease, 1, px=READER_LEASE_MS)
            pipe.hget(meta, "rowseq")
            pipe.xrevrange(log, count=1)
            _, written, last = pipe.execute()
            buckets: list[Any] = list(self.client.zrangebyscore(self._key(partition, "aggidx"), since_bucket, "+inf"))
            pipe = self.client.pipeline(transaction=False)
            for bucket in buckets:
                pipe.hgetall(self._key(partition, "rows", int(bucket)))
            replies = pipe.execute()
        rows = [(int(bucket), *state_format.decode_row_field(field), state_format.decode_row(value))
                for bucket, held in zip(buckets, replies, strict=True) for field, value in held.items()]
        newest = last[0] if last else None
        cursor = (_log_cursor(newest) if newest is not None and int(newest[1][b"n"]) >= int(written or 0)
                  else f"{_text(newest[0]) if newest is not None else '0-0'}/{int(written or 0)}")
        return RowRead(cursor, True, rows)

    def partitions(self) -> list[str]:
        with self._round_trip("partition list"):
            members = self.client.smembers(f"{self._space}:partitions")
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    def aggregates(self, since_bucket: int | None = None) -> dict[AggregateKey, float]:
        partitions = self.partitions()
        low = since_bucket if since_bucket is not None else "-inf"
        with self._round_trip("aggregate read"):
            pipe = self.client.pipeline(transaction=False)
            for partition in partitions:
                pipe.zrangebyscore(self._key(partition, "aggidx"), low, "+inf")
            bucket_lists = pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            wanted = [(p, int(b)) for p, buckets in zip(partitions, bucket_lists, strict=True) for b in buckets]
            for partition, bucket in wanted:
                pipe.hgetall(self._key(partition, "agg", bucket))
            hashes = pipe.execute()
        parts: dict[AggregateKey, list[float]] = {}
        for (_, bucket), values in zip(wanted, hashes, strict=True):
            for raw_field, raw_value in values.items():
                segment, name = state_format.decode_aggregate_field(raw_field)
                parts.setdefault((bucket, segment, name), []).append(float(raw_value))
        # fsum: the total does not depend on the order partitions are read in.
        return {key: math.fsum(values) for key, values in parts.items()}

    def read_aggregates(self, marks: Mapping[str, str], since_bucket: int) -> Iterator[AggregateRead]:
        # A mark is "<generation's key space> <aggepoch>/<offset>" as read before the buckets: a
        # commit after that read scores its buckets above the offset, so the next read takes them
        # (again, perhaps). A mark of another generation or aggepoch is read on from by no one.
        space = self._space
        partitions = self.partitions()
        with self._round_trip("aggregate change read"):
            pipe = self.client.pipeline(transaction=False)
            for partition in partitions:
                pipe.hgetall(self._key(partition, "meta"))
            for partition in partitions:
                seen = marks.get(partition)
                # Nothing to read on from: an empty range keeps the replies one per partition.
                low = f"({seen.rpartition('/')[2]}" if seen else "+inf"
                pipe.zrangebyscore(self._key(partition, "aggchg"), low, "+inf")
            replies = pipe.execute()
            metas, changed = replies[:len(partitions)], replies[len(partitions):]
            marks_now: list[str | None] = []
            whole: list[bool] = []
            for partition, meta in zip(partitions, metas, strict=True):
                offset, epoch = meta.get(b"offset"), meta.get(b"aggepoch")
                # Else a writer of an earlier version committed last, and aggchg lacks its buckets.
                mark = f"{space} {int(epoch or 0)}/{int(offset or -1)}" if offset == meta.get(b"aggmark") else None
                seen = marks.get(partition)
                marks_now.append(mark)
                whole.append(seen is None or mark is None or seen.rpartition("/")[0] != mark.rpartition("/")[0])
            pipe = self.client.pipeline(transaction=False)
            for partition, is_whole in zip(partitions, whole, strict=True):
                if is_whole:
                    pipe.zrangebyscore(self._key(partition, "aggidx"), since_bucket, "+inf")
            listed = iter(pipe.execute())
        wanted = [(p, [int(b) for b in (next(listed) if is_whole else changes) if int(b) >= since_bucket],
                   mark, is_whole)
                  for p, is_whole, changes, mark in zip(partitions, whole, changed, marks_now, strict=True)]
        # A handful of distinct fields over millions of values in a first read: each decoded once.
        decoded: dict[bytes, tuple[str, str]] = {}

        def field(raw: bytes) -> tuple[str, str]:
            found = decoded.get(raw)
            if found is None:
                found = decoded[raw] = state_format.decode_aggregate_field(raw)
            return found

        # The buckets a few partitions at a time, so that a whole read never holds them all as
        # Redis replies and Python objects at once (a day of minutes of 64 partitions is millions).
        start = 0
        while start < len(wanted):
            end, buckets = start, 0
            while end < len(wanted) and (end == start or buckets + len(wanted[end][1]) <= AGGREGATE_READ_BUCKETS):
                buckets += len(wanted[end][1])
                end += 1
            with self._round_trip("aggregate read"):
                pipe = self.client.pipeline(transaction=False)
                for partition, numbers, _, _ in wanted[start:end]:
                    for bucket in numbers:
                        pipe.hgetall(self._key(partition, "agg", bucket))
                hashes = iter(pipe.execute())
            for partition, numbers, mark, is_whole in wanted[start:end]:
                sums = {bucket: {field(f): float(v) for f, v in next(hashes).items()} for bucket in numbers}
                yield AggregateRead(partition, mark, is_whole, sums)
            start = end

    def counts(self) -> Counter[str]:
        partitions = self.partitions()
        with self._round_trip("count read"):
            pipe = self.client.pipeline(transaction=False)
            for partition in partitions:
                pipe.hgetall(self._key(partition, "counts"))
            replies = pipe.execute()
        total: Counter[str] = Counter()
        for reply in replies:
            total.update({_text(k): int(v) for k, v in reply.items()})
        return total

    def clock_ms(self) -> int | None:
        partitions = self.partitions()
        with self._round_trip("clock read"):
            pipe = self.client.pipeline(transaction=False)
            for partition in partitions:
                pipe.hget(self._key(partition, "meta"), "clock")
            replies = pipe.execute()
        clocks = [int(c) for c in replies if c is not None]
        return max(clocks) if clocks else None

    def admit(self, label: str, value: str, cap: int) -> bool:
        # A value once admitted stays admitted, and a full set stays full: both answers can be cached.
        cached = self._admitted.get((label, value))
        if cached is None:
            with self._round_trip("segment admission"):
                cached = bool(self.client.eval(_ADMIT, 1, f"{self._space}:segment:{label}", value, str(cap)))
            self._admitted[(label, value)] = cached
        return cached

    def check(self) -> None:
        with self._round_trip("ping"):
            self.client.ping()


def _sent(pool: redis.ConnectionPool, scripts: list[tuple[Any, ...]]) -> Callable[[], list[Any]]:
    """Send commands on a connection of the pool's, and return what reads their replies (and gives
    the connection back): a round trip in two halves, with other work in between."""
    # Typed Any: redis-py's connections are not annotated.
    connection: Any = pool.get_connection()
    try:
        connection.send_packed_command(connection.pack_commands(scripts))
    except BaseException:
        connection.disconnect()
        pool.release(connection)
        raise

    def read() -> list[Any]:
        try:
            return [connection.read_response() for _ in scripts]
        except BaseException:
            # Replies left unread would answer the connection's next command.
            connection.disconnect()
            raise
        finally:
            pool.release(connection)

    return read


def _executed(client: Client, scripts: list[tuple[Any, ...]]) -> list[Any]:
    """Commands sent and their replies read, in one pipelined round trip."""
    pipe = client.pipeline(transaction=False)
    for script in scripts:
        pipe.execute_command(*script)
    return pipe.execute()


class _RedisCommit:
    """Commit scripts sent (`RedisStore.begin_commit`); `finish` reads their replies."""

    def __init__(self, store: RedisStore, commits: list[Commit], state_ttls: list[dict[str, int]], written: float,
                 read: Callable[[], list[Any]], *, sending_s: float = 0.0) -> None:
        self.store = store
        self.commits = commits
        self.state_ttls = state_ttls
        self.written = written
        # What makes the round trip, or its second half: the scripts' replies, or an error.
        self.read = read
        self.sending_s = sending_s

    def finish(self) -> float:
        store, commits = self.store, self.commits
        with store._round_trip("commit", forget=[commit.partition for commit in commits], earlier_s=self.sending_s):
            results = self.read()
        acknowledged = time.monotonic()
        refused = []
        for commit, result, ttls in zip(commits, results, self.state_ttls, strict=True):
            if result == 1:
                # Trusted for less than the key's TTL, which runs from the write.
                for query_id, state in commit.outcome.touched.items():
                    store._cache.put(commit.partition, {query_id: state}, self.written + ttls[query_id] / 1000 * 0.9)
            else:
                store._cache.forget(commit.partition)
                reason = "claimed by a newer holder" if result == 0 else "not at the expected offset"
                refused.append(f"{commit.partition} ({reason})")
        if refused:
            raise FencedError(f"batch not written for partition(s) {', '.join(refused)}")
        return acknowledged


def _log_cursor(entry: Any) -> str:
    entry_id, values = entry
    return f"{_text(entry_id)}/{int(values[b'n'])}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
