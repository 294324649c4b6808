"""The Redis store: each batch committed atomically with its offset, by the partition's holder.

A batch costs two round trips: one pipelined read (query states, impression
ids, clock) and one script call per partition that checks the epoch and the
expected offset and writes states, lists, impression ids, aggregate
increments, counts, the clock and the next offset, all or nothing.

The same code runs on one server and on a Redis Cluster (``connect(...,
cluster=True)``): every script names all its keys and they share one slot, the
two global sets are single-key commands (format 8's shards, which the script names itself, are
in the partition's slot too), and scripts go as EVAL, which the
cluster pipeline routes by key (it refuses EVALSHA) and which no node can
answer with NOSCRIPT after a restart or failover.

Only the instance holding a partition writes it, so that instance keeps the
query states it wrote in a `StateCache` and reads from Redis only the states
it has not got. The cache of a partition is dropped on every claim and on
every failed commit; the offset check makes a stale cache impossible to write
(a Redis that lost its last second would refuse the next commit).

The key layout and the scripts are `state.redis_scripts`'s; the connection, key names and
reads `state.redis_reads`'s; what is stored is `state.format`'s, when it expires `windows`'s,
and the cache is `state.cache`'s.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import Any

import orjson
import redis

from stream_ndcg import reconfigure
from stream_ndcg.engine import QueryChange
from stream_ndcg.errors import ConfigError, FencedError, StoreUnavailable
from stream_ndcg.query_state import QueryState
from stream_ndcg.state import compact_format, experiment_format, shard_format
from stream_ndcg.state import format as state_format
from stream_ndcg.state.base import Commit, CommitInFlight, Snapshot
from stream_ndcg.state.redis_reads import Client, RedisReads, text
from stream_ndcg.state.redis_scripts import ADMIT, ADOPT, COMMIT, ROW_LOG_MS
from stream_ndcg.state.shard_scripts import SEEN_IDS
from stream_ndcg.windows import bucket_ttl_ms, oldest_kept_bucket

logger = logging.getLogger(__name__)


class RedisStore(RedisReads):
    """The `StateStore` on one Redis server or a Redis Cluster.

        store = RedisStore(lambda: connect(url, cluster=True), namespace="sndcg",
                           bucket_ms=60_000, horizon_ms=87_000_000, state_ttl_ms=2_592_000_000)

    With `wait_replicas` (one server, with replicas), each commit's scripts are followed by
    `WAIT wait_replicas wait_timeout_ms` on the same connection: a commit counts as acknowledged
    only once that many replicas have it, so a failover cannot lose it (a commit the replicas did
    not confirm in time is a `StoreUnavailable`: the instance claims again and reads the stored
    offset, which the commit moved or not, as after any lost reply).
    """

    def __init__(self, client: Client | Callable[[], Client], *, wait_replicas: int = 0,
                 wait_timeout_ms: int = 1_000, write_format: int = state_format.FORMAT_VERSION,
                 **options: Any) -> None:
        super().__init__(client, **options)
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        # The format this instance writes: the previous one (6) for a release whose rollback must
        # stay possible, until the state is written in this one (`adopt` refuses to go back).
        self.write_format = write_format
        # partition -> the `name_hash` of each impression id its last load looked up, for its commit.
        self._id_hashes: dict[str, dict[str, int]] = {}

    def adopt(self, config: Mapping[str, object], *, rebuild: bool = False) -> bool:
        keys = self._config_keys()
        # Another instance that records a configuration between the read and the write makes the
        # write fail: read it and decide again (it is most likely the same decision).
        for _ in range(10):
            held_text, found_format = self._read_config()
            state_format.check_format(found_format)
            state_format.check_written_format(found_format, self.write_format)
            record, rebuilt = reconfigure.decide(orjson.loads(held_text) if held_text else None, config,
                                                 rebuild=rebuild)
            wanted = held_text if record is None else orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()
            with self._round_trip("configuration record"):
                generation, found = self.client.eval(ADOPT, 3, *keys, wanted, held_text, "1" if rebuilt else "0",
                                                     str(self.write_format),
                                                     ",".join(state_format.READABLE_FORMATS))
            if generation == -2:
                state_format.check_format(text(found))
            if generation >= 0:
                break
        else:
            raise ConfigError("the recorded metric configuration kept changing while this instance started: "
                              "are instances with different configurations starting together?")
        self._space = self.namespace if generation == 0 else f"{self.namespace}#{generation}"
        self._cache.forget_all()
        self._admitted.clear()
        return rebuilt

    def claim(self, partition: str) -> str:
        self._cache.forget(partition)
        self._id_hashes.pop(partition, None)
        with self._round_trip("claim"):
            epoch = uuid.uuid4().hex
            self.client.set(self._key(partition, "epoch"), epoch)
            self.client.sadd(f"{self._space}:partitions", partition)
        return epoch

    def load(self, partition: str, query_ids: Collection[str], impressions: Mapping[str, int]) -> Snapshot:
        states: dict[str, QueryState] = {}
        now = time.monotonic()
        for query_id in query_ids:
            cached = self._cache.get(partition, query_id, now)
            if cached is not None:
                states[query_id] = cached
        queries = [q for q in query_ids if q not in states]
        # id -> its `name_hash`, which the commit sends on with the id.
        ids = self._id_hashes[partition] = {i: shard_format.name_hash(i) for i in impressions}
        with self._round_trip("load"):
            pipe = self.client.pipeline(transaction=False)
            for query_id in queries:
                pipe.hgetall(self._key(partition, "q", query_id))
                pipe.hgetall(self._key(partition, "g", query_id))
            if ids:
                # Format 7's sorted set, then format 8's shards (either may hold ids of the dedup horizon).
                pipe.zmscore(self._key(partition, "imp"), list(ids))
                pipe.execute_command("EVAL", SEEN_IDS, 1, self._key(partition, "iddir"),
                                     self._key(partition, "ids", ""), *[item for pair in ids.items() for item in pair])
            pipe.hget(self._key(partition, "meta"), "clock")
            replies = pipe.execute()
        decoded: dict[str, QueryState] = {}
        for n, query_id in enumerate(queries):
            fields, compact = replies[2 * n], replies[2 * n + 1]
            if fields or compact:
                state = decoded[query_id] = state_format.state_from_fields(fields)
                if compact:
                    compact_format.groups_from_fields(state, compact)
        self._complete_lists(partition, decoded)
        states.update(decoded)
        known: dict[str, int] = {}
        if ids:
            for i, scored, sharded in zip(ids, replies[2 * len(queries)], replies[2 * len(queries) + 1], strict=True):
                if scored is not None or sharded is not None:
                    known[i] = max(int(found) for found in (scored, sharded) if found is not None)
        clock = replies[-1]
        return Snapshot(states, known, int(clock) if clock is not None else None)

    def _complete_lists(self, partition: str, states: Mapping[str, QueryState]) -> None:
        """Give each group stored without its lists (those of the pool ideal) the lists of its
        bucket's lists hash: the engine scores them for the sums of squares."""
        wanted = sorted({(query_id, bucket) for query_id, state in states.items()
                         for (bucket, _), group in state.groups.items()
                         if not compact_format.whole_lists(group)})
        if not wanted:
            return
        with self._round_trip("list read"):
            pipe = self.client.pipeline(transaction=False)
            for query_id, bucket in wanted:
                pipe.hgetall(self._key(partition, "lists", query_id, bucket))
            replies = pipe.execute()
        for (query_id, bucket), reply in zip(wanted, replies, strict=True):
            groups = {segment: group for (b, segment), group in states[query_id].groups.items()
                      if b == bucket and not compact_format.whole_lists(group)}
            documents = {segment: list(group.ranks) for segment, group in groups.items()}
            found: dict[str, dict[tuple[str, ...], int]] = {}
            for raw_field, count in reply.items():
                listed = state_format.decode_list_field(raw_field, documents)
                if listed is not None:
                    lists = found.setdefault(listed[0], {})
                    lists[listed[1]] = lists.get(listed[1], 0) + int(count)
            for segment, lists in found.items():
                group = groups[segment]
                if sum(lists.values()) == group.impressions:
                    group.lists = lists

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
        scripts = [("EVAL", COMMIT, len(keys), *keys, commit.epoch, payload,
                    "" if commit.expected_offset is None else str(commit.expected_offset))
                   for commit, (keys, payload, _) in zip(commits, prepared, strict=True)]
        client = self.client
        if self.wait_replicas and isinstance(client, redis.Redis):
            scripts.append(("WAIT", self.wait_replicas, self.wait_timeout_ms))
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
                                                              "aggchg", "iddir")]

        def index(key: str) -> int:
            keys.append(key)
            return len(keys)  # Lua counts from 1

        clock = outcome.clock_ms
        now = time.time() * 1000 if self.wall_clock else clock

        def ttl(bucket: int) -> int:
            return bucket_ttl_ms(bucket, now, self.horizon_ms, self.bucket_ms)

        states: list[list[Any]] = []
        state_ttls: dict[str, int] = {}
        compacted: set[tuple[str, int, str]] = set()
        # The lists the batch showed, by query and group.
        shown: dict[str, dict[tuple[int, str], list[tuple[str, ...]]]] = {}
        if self.write_format >= 7:
            for (q, bucket, segment, ranked) in outcome.lists:
                shown.setdefault(q, {}).setdefault((bucket, segment), []).append(ranked)
        for query_id, state in outcome.touched.items():
            query_change = outcome.changes[query_id]
            compact = self._compact_groups(state, query_change)
            moved = {key for key in compact if not compact_format.holds(state, key)}
            written, removed, appended = state_format.changed_fields(state, query_change, compact, moved)
            # Judgments outlive the query's last event by the judgment TTL. A state without any
            # holds only groups, which all fall behind the horizon with its newest bucket: the
            # engine would drop them at the query's next event, and Redis drops them unasked (a
            # query shown once would otherwise hold its groups for the judgment TTL). Only under
            # the wall clock, which Redis's TTLs count in: an event clock may run slower.
            grouped_only = self.wall_clock and not state.revisions
            state_ttl = state_ttls[query_id] = (max(map(ttl, (b for b, _ in state.groups)), default=1)
                                                if grouped_only else self.state_ttl_ms)
            states.append([index(self._key(partition, "q", query_id)), state_ttl, written, removed, appended])
            if self.write_format >= 7:
                write = compact_format.compact_changes(state, compact, query_change.removed, shown.get(query_id, {}),
                                                       repeats=self.write_format >= 8)
                # The groups expire with the newest of them: the horizon's TTL of its bucket. The
                # cached state is trusted no longer, written now or not: it knows what the hash holds.
                groups_ttl = ttl(max(b for b, _ in state.groups)) if state.groups else state_ttl
                state_ttls[query_id] = min(state_ttl, groups_ttl)
                if write.written or write.removed or write.afresh:
                    states.append([index(self._key(partition, "g", query_id)), groups_ttl, write.written,
                                   write.removed, [], write.afresh])
                compacted.update((query_id, bucket, segment) for bucket, segment in compact)

        lists = [[index(self._key(partition, "lists", q, b)), ttl(b), fields]
                 for (q, b), fields in state_format.list_increments(outcome, compacted).items()]
        # Format 8 keeps them in the sharded hashes (each with the `name_hash` its load found), format 7
        # in the sorted set.
        hashes = self._id_hashes.pop(partition, {})
        ids = [item for i, b in outcome.impression_buckets.items()
               for item in (str(b), i, hashes.get(i) or shard_format.name_hash(i))] if self.write_format >= 8 else []
        impressions = [] if ids else [item for i, b in outcome.impression_buckets.items() for item in (str(b), i)]
        aggs = [[index(self._key(partition, "agg", b)), ttl(b), str(b), fields]
                for b, fields in state_format.aggregate_increments(outcome).items()]
        # The script logs the rows itself while a reader holds the lease: they cross the network once.
        row_writes = state_format.row_writes(
            outcome, shard_format.encode_row_8 if self.write_format >= 8
            else shard_format.encode_row if self.write_format >= 7 else state_format.encode_row)
        if self.write_format >= 8:
            # Format 8's shards, named by the script from their prefix (in the partition's slot),
            # under the bucket's directory; the bucket's format 7 hash loses the rows written. A new
            # bucket takes its shard count from the bucket before it (its directory named after the
            # prefix); each row's query goes with its `name_hash`, so that Redis does not hash it.
            rows = [[index(self._key(partition, "rowdir", b)), ttl(b), fields, b,
                     index(self._key(partition, "rows", b)), self._key(partition, "rows", b, ""),
                     self._key(partition, "rowdir", b - 1),
                     [shard_format.name_hash(field.partition("\x1f")[2]) for field in fields[::2]]]
                    for b, fields in row_writes.items()]
        else:
            rows = [[index(self._key(partition, "rows", b)), ttl(b), fields, b] for b, fields in row_writes.items()]
        prune = str(oldest_kept_bucket(now, self.horizon_ms, self.bucket_ms)) if now is not None else None
        forget = str(oldest_kept_bucket(now, self.dedup_horizon_ms, self.bucket_ms)) if now is not None else None
        # Before the clock moves: a partition marks an experiment's first bucket by the clock it had.
        exps = [[index(self._key(partition, "exp", name)), first_bucket, self.experiment_ttl_ms, increments]
                for name, first_bucket, increments in experiment_format.cell_increments(commit.experiments)]
        payload = {
            "states": states, "lists": lists, "impressions": impressions, "aggs": aggs, "rows": rows,
            "ids": ids, "id_prefix": self._key(partition, "ids", ""), "id_span": self._id_slot_buckets(),
            "exps": exps, "bucket_ms": self.bucket_ms,
            "row_log_ms": ROW_LOG_MS,
            "counts": [[name, n] for name, n in outcome.counts.items()],
            # The horizon's TTL, not the dedup horizon's: `forget` prunes by the clock, and under
            # the event clock a pause in traffic must not expire ids the clock still remembers.
            "imp_ttl": max(map(ttl, outcome.impression_buckets.values()), default=0),
            "offset": str(commit.next_offset), "clock": str(clock) if clock is not None else None, "prune": prune,
            "forget": forget,
        }
        return keys, orjson.dumps(payload).decode(), state_ttls

    def _id_slot_buckets(self) -> int:
        """The buckets of one slot of impression ids (format 8): a quarter of the dedup horizon, so
        that the ids held past it are at most a quarter more, and a lookup reads about five slots."""
        return max(1, -(-self.dedup_horizon_ms // self.bucket_ms) // 4)

    def _compact_groups(self, state: QueryState, change: QueryChange) -> set[tuple[int, str]]:
        """The batch's changed groups written to the query's compact hash (format 7): those whose
        every impression is in a list they hold; the others stay in format 6 until they go."""
        if self.write_format < 7:
            return set()
        # A group the compact hash holds has all its lists: the engine adds each impression's.
        return {key for key in change.dirty & state.groups.keys()
                if compact_format.holds(state, key) or compact_format.whole_lists(state.groups[key])}

    def admit(self, label: str, value: str, cap: int) -> bool:
        # A value once admitted stays admitted, and a full set stays full: both answers can be cached.
        cached = self._admitted.get((label, value))
        if cached is None:
            with self._round_trip("segment admission"):
                cached = bool(self.client.eval(ADMIT, 1, f"{self._space}:segment:{label}", value, str(cap)))
            self._admitted[(label, value)] = cached
        return cached


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
        forget = [commit.partition for commit in commits]
        with store._round_trip("commit", forget=forget, earlier_s=self.sending_s):
            results = self.read()
        acknowledged = time.monotonic()
        if len(results) > len(commits):
            replicated = results.pop()
            if replicated < store.wait_replicas and 1 in results:
                for partition in forget:
                    store._cache.forget(partition)
                raise StoreUnavailable(f"commit confirmed by {replicated} of the {store.wait_replicas} replicas "
                                       f"wait_replicas asks for within {store.wait_timeout_ms} ms")
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

