"""The judge's store on Redis: each batch of a partition written with its offset by one script.

Key layout (``ns`` is the namespace setting, by default `run`'s group id, so that a pipeline's
`run` and `judge` share it; ``{ns:judge:P}`` is a Redis Cluster hash tag, so that everything of
input partition P = ``topic:partition`` lives in one slot and one script writes it):

    {ns}:judge:format          STRING  `state.judge_format.JUDGE_FORMAT_VERSION` of the judge state
    ns:judge:partitions        SET     every partition ever claimed (for the exporter)
    {ns:judge:P}:epoch         STRING  fencing token: a random one per claim
    {ns:judge:P}:meta          HASH    offset (next to consume), the judge's scalars
                                       (`state.judge_format`), and the exporter's figures:
                                       grades (JSON grade -> pairs) and ctr (JSON [boundary,
                                       shown by rank, clicked by rank] of the last boundary decided)
    {ns:judge:P}:sessions, held, ranks, graded, pairs:<bucket>
                               HASH    the judge's state (`state.judge_format`)
    {ns:judge:P}:outbox        LIST    judgment events decided and not yet known to be published
                                       (JSON, oldest first)
    {ns:judge:P}:closed        HASH    boundary -> the partition's rank counts over the horizon when
                                       it closed it ("shown,...|clicked,..."), until every partition
                                       has decided it

No key expires: the judge forgets by its own clock (`click_horizon`, `dedup_horizon`), which
under the event clock may run slower than Redis's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from typing import Any

import orjson

from stream_ndcg.click_state import Pair
from stream_ndcg.errors import FencedError
from stream_ndcg.state import judge_format
from stream_ndcg.state.judge_store import (
    Given,
    JudgeCommit,
    Loaded,
    Status,
    given_of,
    ranks_of_text,
    ranks_text,
    status_of_meta,
)
from stream_ndcg.state.redis_reads import Client, RedisClient, round_trip, text

# KEYS epoch, meta, outbox, closed, then the state's hashes; ARGV epoch, expected offset ('' for
# none), payload: {offset, meta [field, value...], dropped [key index], removed [[key index,
# [field...]]], set [[key index, [field, value...]]], outbox [json...], closed [boundary, ranks] or
# null, prune boundary or null}.
COMMIT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[2], 'offset') ~= (ARGV[2] ~= '' and ARGV[2] or false) then return -1 end
local p = cjson.decode(ARGV[3])
for _, k in ipairs(p.dropped) do redis.call('DEL', KEYS[k]) end
for _, r in ipairs(p.removed) do
  for i = 1, #r[2], 200 do redis.call('HDEL', KEYS[r[1]], unpack(r[2], i, math.min(i + 199, #r[2]))) end
end
for _, s in ipairs(p.set) do
  for i = 1, #s[2], 200 do redis.call('HSET', KEYS[s[1]], unpack(s[2], i, math.min(i + 199, #s[2]))) end
end
for i = 1, #p.outbox, 200 do redis.call('RPUSH', KEYS[3], unpack(p.outbox, i, math.min(i + 199, #p.outbox))) end
if p.closed ~= cjson.null then redis.call('HSET', KEYS[4], p.closed[1], p.closed[2]) end
if p.prune ~= cjson.null then
  for _, b in ipairs(redis.call('HKEYS', KEYS[4])) do
    if tonumber(b) < tonumber(p.prune) then redis.call('HDEL', KEYS[4], b) end
  end
end
redis.call('HSET', KEYS[2], 'offset', p.offset, unpack(p.meta))
return 1
"""

PUBLISHED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('LTRIM', KEYS[2], ARGV[2], -1)
return 1
"""

ADOPT = """
local found = redis.call('GET', KEYS[1])
if found then return found end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""

STATE_HASHES = ("meta", "sessions", "held", "ranks", "graded")


class RedisJudgeStore(RedisClient):
    """The `JudgeStore` on one Redis server or a Redis Cluster; `client` may be a factory, called at
    the first round trip and again after each failed attempt to connect.

        store = RedisJudgeStore(lambda: connect(url), namespace="stream-ndcg")
    """

    def __init__(self, client: Client | Callable[[], Client], *, namespace: str) -> None:
        super().__init__(client)
        self.namespace = namespace

    def _key(self, partition: str, name: str) -> str:
        return f"{{{self.namespace}:judge:{partition}}}:{name}"

    def adopt(self) -> None:
        with round_trip("judge format record"):
            found = self.client.eval(ADOPT, 1, f"{{{self.namespace}}}:judge:format",
                                     str(judge_format.JUDGE_FORMAT_VERSION))
        judge_format.check_judge_format(text(found))

    def claim(self, partition: str) -> str:
        epoch = uuid.uuid4().hex
        with round_trip("claim"):
            self.client.set(self._key(partition, "epoch"), epoch)
            self.client.sadd(f"{self.namespace}:judge:partitions", partition)
        return epoch

    def load(self, partition: str) -> Loaded:
        with round_trip("judge state read"):
            pipe = self.client.pipeline(transaction=False)
            for name in STATE_HASHES:
                pipe.hgetall(self._key(partition, name))
            pipe.lrange(self._key(partition, "outbox"), 0, -1)
            *replies, outbox = pipe.execute()
            hashes: dict[str, Any] = dict(zip(STATE_HASHES, replies, strict=True))
            buckets = [text(b) for b in hashes["ranks"]]
            pipe = self.client.pipeline(transaction=False)
            for bucket in buckets:
                pipe.hgetall(self._key(partition, f"{judge_format.PAIRS}{bucket}"))
            for bucket, reply in zip(buckets, pipe.execute() if buckets else [], strict=True):
                hashes[f"{judge_format.PAIRS}{bucket}"] = reply
        offset = hashes["meta"].get(b"offset")
        return Loaded(judge_format.state_of_fields(hashes), int(offset) if offset is not None else None, list(outbox))

    def commit(self, commits: Collection[JudgeCommit]) -> None:
        if not commits:
            return
        scripts = [self._script(commit) for commit in commits]
        with round_trip("judge commit"):
            pipe = self.client.pipeline(transaction=False)
            for script in scripts:
                pipe.execute_command(*script)
            results = pipe.execute()
        refused = [f"{c.partition} ({'claimed by a newer holder' if r == 0 else 'not at the expected offset'})"
                   for c, r in zip(commits, results, strict=True) if r != 1]
        if refused:
            raise FencedError(f"batch not written for partition(s) {', '.join(refused)}")

    def _script(self, commit: JudgeCommit) -> tuple[Any, ...]:
        partition = commit.partition
        keys = [self._key(partition, name) for name in ("epoch", "meta", "outbox", "closed")]
        indices: dict[str, int] = {}

        def index(name: str) -> int:
            if name not in indices:
                keys.append(self._key(partition, name))
                indices[name] = len(keys)  # Lua counts from 1
            return indices[name]

        writes = judge_format.writes(commit.changes)
        meta = {**writes.set.pop("meta", {}), **commit.figures}
        payload = {
            "offset": str(commit.next_offset),
            "meta": [item for pair in meta.items() for item in pair],
            "dropped": [index(name) for name in writes.dropped],
            "removed": [[index(name), fields] for name, fields in writes.removed.items()],
            "set": [[index(name), [item for pair in fields.items() for item in pair]]
                    for name, fields in writes.set.items()],
            "outbox": [message.decode() for message in commit.outbox],
            "closed": None if commit.closed_ranks is None else [str(commit.closed_ranks[0]),
                                                                 ranks_text(commit.closed_ranks[1])],
            "prune": None if commit.prune_before is None else str(commit.prune_before),
        }
        expected = "" if commit.expected_offset is None else str(commit.expected_offset)
        return ("EVAL", COMMIT, len(keys), *keys, commit.epoch, expected, orjson.dumps(payload).decode())

    def published(self, partition: str, epoch: str, count: int) -> None:
        with round_trip("outbox trim"):
            done = self.client.eval(PUBLISHED, 2, self._key(partition, "epoch"), self._key(partition, "outbox"),
                                    epoch, str(count))
        if done != 1:
            raise FencedError(f"outbox of {partition} not trimmed: claimed by a newer holder")

    def statuses(self, partitions: Collection[str]) -> dict[str, Status]:
        names = list(partitions)
        with round_trip("judge status read"):
            pipe = self.client.pipeline(transaction=False)
            for partition in names:
                pipe.hmget(self._key(partition, "meta"), ["clock", "closed"])
            replies = pipe.execute() if names else []
        return {p: status_of_meta({"clock": clock, "closed": closed})
                for p, (clock, closed) in zip(names, replies, strict=True)}

    def closed_ranks(self, partitions: Collection[str], boundary: int) -> dict[str, list[list[int]] | None]:
        names = list(partitions)
        with round_trip("closed rank counts read"):
            pipe = self.client.pipeline(transaction=False)
            for partition in names:
                pipe.hget(self._key(partition, "closed"), str(boundary))
            replies = pipe.execute() if names else []
        return {p: None if reply is None else ranks_of_text(text(reply))
                for p, reply in zip(names, replies, strict=True)}

    def figures(self) -> dict[str, dict[str, str]]:
        with round_trip("judge figures read"):
            partitions = sorted(text(p) for p in self.client.smembers(f"{self.namespace}:judge:partitions"))
            pipe = self.client.pipeline(transaction=False)
            for partition in partitions:
                pipe.hgetall(self._key(partition, "meta"))
            replies = pipe.execute() if partitions else []
        return {p: {text(k): text(v) for k, v in reply.items()} for p, reply in zip(partitions, replies, strict=True)}

    def check(self) -> None:
        with round_trip("ping"):
            self.client.ping()

    def recorded_format(self) -> str | None:
        with round_trip("judge format read"):
            found = self.client.get(f"{{{self.namespace}}}:judge:format")
        return None if found is None else text(found)

    def partitions(self) -> list[str]:
        with round_trip("judge partitions read"):
            return sorted(text(p) for p in self.client.smembers(f"{self.namespace}:judge:partitions"))

    def graded(self, partition: str, pairs: Collection[Pair] | None = None) -> dict[Pair, Given]:
        key = self._key(partition, "graded")
        with round_trip("judge grades read"):
            if pairs is None:
                # By cursor: a partition may hold millions of pairs, and one HGETALL would block Redis.
                found = dict(self.client.hscan_iter(key, count=1000))
            else:
                fields = [judge_format.pair_field(pair) for pair in pairs]
                found = {f: v for f, v in zip(fields, self.client.hmget(key, fields) if fields else [], strict=True)
                         if v is not None}
        return given_of(judge_format.graded_of_fields(found))
