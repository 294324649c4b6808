"""What every user of the Redis state shares: the connection, the key names, and the reads.

`RedisReads` serves the exporter's scrapes and the drill-down's explorer, which only read;
`state.redis.RedisStore` adds the writes of the instance that holds a partition. The key
layout is `state.redis_scripts`'s docstring.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson
import redis
from redis.connection import SSLConnection, parse_url
from redis.exceptions import MovedError, RedisClusterException, RedisError
from redis.sentinel import Sentinel

from stream_ndcg.errors import StoreUnavailable
from stream_ndcg.state import compact_format, experiment_format, redis_rows
from stream_ndcg.state import format as state_format
from stream_ndcg.state.base import ExperimentRead, RowRead
from stream_ndcg.state.cache import CacheFigures, StateCache
from stream_ndcg.state.redis_rows import text as text  # re-exported: the stores read replies with it
from stream_ndcg.state.redis_scripts import AGGREGATE_READ_BUCKETS
from stream_ndcg.vocabulary import AggregateKey
from stream_ndcg.window_sums import AggregateRead

logger = logging.getLogger(__name__)

Client = redis.Redis | redis.RedisCluster


def connect(url: str, *, cluster: bool = False, ca_file: str = "", sentinels: str = "",
            master: str = "") -> Client:
    """A client for one server, for the master that `sentinels` (host:port,...) name `master`, or
    for a cluster discovered from the node in `url`.

    A client for one server, or through sentinels, connects on its first command (and, through
    sentinels, asks them again for the master after a connection fails: a failover is followed);
    a cluster client asks for the slot map at once, so an unreachable cluster raises
    StoreUnavailable here (hand the store a factory to defer that to the first round trip, where
    the loop backs off).
    """
    options: dict[str, Any] = {"socket_timeout": 10, "socket_connect_timeout": 5, "health_check_interval": 30}
    if ca_file:
        options["ssl_ca_certs"] = ca_file
    if sentinels:
        # redis_url's user, password, database and TLS, for the master; the sentinels take no password.
        parsed: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
        auth = {key: parsed[key] for key in ("username", "password", "db") if key in parsed}
        tls = {"ssl": True} if parsed.get("connection_class") is SSLConnection else {}
        if not tls:
            options.pop("ssl_ca_certs", None)
        addresses = [(host, int(port)) for host, _, port in (a.rpartition(":") for a in sentinels.split(","))]
        found = Sentinel(addresses, socket_timeout=5, socket_connect_timeout=5)  # type: ignore[no-untyped-call]
        client: redis.Redis = found.master_for(master, **options, **auth, **tls)  # type: ignore[no-untyped-call]
        return client
    if not cluster:
        return redis.Redis.from_url(url, **options)
    try:
        return redis.RedisCluster.from_url(url, **options)
    except (RedisError, RedisClusterException) as exc:
        raise StoreUnavailable(f"Redis Cluster unreachable: {type(exc).__name__}: {exc}") from exc


class RedisClient:
    """A Redis client made at the first round trip: `client` may be a client or a factory, called
    then and again after each failed attempt to connect. The readers of `run`'s state and the
    judge's store (`state.judge_redis`) both hold one."""

    def __init__(self, client: Client | Callable[[], Client]) -> None:
        self._client = client if isinstance(client, redis.Redis | redis.RedisCluster) else None
        self._connect = client if callable(client) else lambda: client

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self._connect()
        return self._client


def store_unavailable(what: str, exc: RedisError | RedisClusterException) -> StoreUnavailable:
    """A Redis error as the incident it is, naming the round trip that failed."""
    hint = " (a cluster node answered: set redis_cluster)" if isinstance(exc, MovedError) else ""
    return StoreUnavailable(f"Redis {what} failed: {type(exc).__name__}: {exc}{hint}")


@contextmanager
def round_trip(what: str) -> Iterator[None]:
    """Make a Redis error of the block a `StoreUnavailable` naming `what`."""
    try:
        yield
    except (RedisError, RedisClusterException) as exc:
        raise store_unavailable(what, exc) from exc


class RedisReads(RedisClient):
    """The Redis state as its readers see it; `client` may be a factory, called at the first
    round trip and again after each failed attempt to connect.

        reads = RedisReads(lambda: connect(url), namespace="sndcg", bucket_ms=60_000,
                           horizon_ms=87_000_000, state_ttl_ms=2_592_000_000)
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
        cache_bytes: int = 128 * 2**20,
        experiment_ttl_ms: int = 90 * 86_400_000,
        observe_round_trip: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        super().__init__(client)
        self.namespace = namespace
        # Where this instance's keys live: the namespace, and a generation after each rebuild.
        self._space = namespace
        self._cache = StateCache(cache_groups, cache_bytes)
        self.bucket_ms = bucket_ms
        self.horizon_ms = horizon_ms
        self.state_ttl_ms = max(state_ttl_ms, horizon_ms)
        # Impression ids are forgotten behind this (None: the horizon).
        self.dedup_horizon_ms = dedup_horizon_ms or horizon_ms
        self.wall_clock = wall_clock
        # How long an experiment's cells are kept after the last commit that named it.
        self.experiment_ttl_ms = experiment_ttl_ms
        self._observe = observe_round_trip
        self._admitted: dict[tuple[str, str], bool] = {}

    def cache_figures(self) -> CacheFigures:
        """What the cache of the states this instance wrote did and holds (`state.cache`)."""
        return self._cache.figures()

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
            raise store_unavailable(what, exc) from exc
        finally:
            if observe:
                self._observe(earlier_s + time.perf_counter() - started)

    def _key(self, partition: str, *parts: object) -> str:
        return ":".join([f"{{{self._space}:{partition}}}", *map(str, parts)])

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
        return ("" if held is None else text(held)), (None if found_format is None else text(found_format))

    def _config_keys(self) -> list[str]:
        return [f"{{{self.namespace}}}:{name}" for name in ("config", "generation", "format")]

    def next_offset(self, partition: str) -> int | None:
        with self._round_trip("offset read"):
            value = self.client.hget(self._key(partition, "meta"), "offset")
        return int(value) if value is not None else None

    def ranked_lists(self, partition: str, query_id: str) -> dict[tuple[int, str, tuple[str, ...]], int]:
        with self._round_trip("list read"):
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(self._key(partition, "q", query_id))
            pipe.hgetall(self._key(partition, "g", query_id))
            fields, compact = pipe.execute()
            # The groups of format 7 hold their lists; those of earlier formats have them in their
            # bucket's lists hash (a group moved to format 7 is no longer in the query's hash).
            held = compact_format.compact_lists(compact) if compact else {}
            groups = state_format.state_from_fields(fields).groups if fields else {}
            buckets = sorted({b for b, _ in groups})
            pipe = self.client.pipeline(transaction=False)
            for bucket in buckets:
                pipe.hgetall(self._key(partition, "lists", query_id, bucket))
            replies = pipe.execute()
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
        return self._read_rows({partition: cursor}, since_bucket, [partition])[partition]

    def read_all_rows(self, cursors: Mapping[str, str | None], since_bucket: int) -> dict[str, RowRead]:
        return self._read_rows(cursors, since_bucket, None)

    def _read_rows(self, cursors: Mapping[str, str | None], since_bucket: int,
                   partitions: list[str] | None) -> dict[str, RowRead]:
        """The rows of `partitions` (None: every partition, listed in the same round trip): the logs
        of all those with a cursor read in one pipeline (`redis_rows`), the others whole."""
        following = {p: c for p, c in cursors.items() if c is not None and (partitions is None or p in partitions)}
        replies: list[Any] = []
        # A partition read alone, whole, has no log to read: no round trip but the whole read's.
        if partitions is None or following:
            with self._round_trip("row log read"):
                pipe = self.client.pipeline(transaction=False)
                if partitions is None:
                    pipe.smembers(f"{self._space}:partitions")
                for partition, cursor in following.items():
                    redis_rows.queue_log_read(pipe, functools.partial(self._key, partition), cursor)
                replies = pipe.execute()
        if partitions is None:
            partitions = sorted(map(text, replies.pop(0)))
        size = redis_rows.LOG_READ_REPLIES
        logged = {p: redis_rows.rows_after(c, replies[at * size:(at + 1) * size])
                  for at, (p, c) in enumerate(following.items())}
        found: dict[str, RowRead] = {}
        for partition in partitions:
            read = logged.get(partition)
            if read is None:
                with self._round_trip("row read"):
                    read = redis_rows.read_whole(self.client, functools.partial(self._key, partition), since_bucket)
            found[partition] = read
        return found

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
            total.update({text(k): int(v) for k, v in reply.items()})
        return total

    def experiment(self, name: str) -> ExperimentRead:
        partitions = self.partitions()
        with self._round_trip("experiment read"):
            pipe = self.client.pipeline(transaction=False)
            for partition in partitions:
                pipe.hgetall(self._key(partition, "exp", name))
            hashes = pipe.execute()
        parts: dict[tuple[str, str, str], list[float]] = {}
        first_buckets: dict[str, int] = {}
        for partition, held in zip(partitions, hashes, strict=True):
            for raw_field, raw_value in held.items():
                cell = experiment_format.decode_cell_field(raw_field)
                if cell is None:
                    first_buckets[partition] = int(raw_value)
                else:
                    parts.setdefault(cell, []).append(float(raw_value))
        return ExperimentRead({cell: math.fsum(values) for cell, values in parts.items()}, first_buckets)

    def clock_ms(self) -> int | None:
        partitions = self.partitions()
        with self._round_trip("clock read"):
            pipe = self.client.pipeline(transaction=False)
            for partition in partitions:
                pipe.hget(self._key(partition, "meta"), "clock")
            replies = pipe.execute()
        clocks = [int(c) for c in replies if c is not None]
        return max(clocks) if clocks else None

    def check(self) -> None:
        with self._round_trip("ping"):
            self.client.ping()
