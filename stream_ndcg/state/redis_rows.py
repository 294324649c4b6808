"""The drill-down's row log as Redis holds it: what a reader queues to read on from a cursor, and
how it tells the entries it got from a gap (`redis_reads.RedisReads.read_all_rows`).

A cursor is "<entry id>/<rowseq>" of the last entry read: the entries after it must carry
rowseq + 1, + 2... up to the count, or rows were written that the log does not hold (trimmed,
or written while no reader held the lease), and the reader reads the partition's rows whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from stream_ndcg.state import format as state_format
from stream_ndcg.state import shard_format
from stream_ndcg.state.base import RowRead
from stream_ndcg.state.redis_scripts import READER_LEASE_MS

# The replies `queue_log_read` queues per partition.
LOG_READ_REPLIES = 3


def queue_log_read(pipe: Any, key: Callable[..., str], cursor: str) -> None:
    """Queue on `pipe` the reads of the entries after `cursor` of the partition whose keys `key`
    names: the lease renewed, the count of rows written, the entries."""
    pipe.set(key("reader"), 1, px=READER_LEASE_MS)
    # The count first: a commit landing between the two reads adds an entry, never a gap.
    pipe.hget(key("meta"), "rowseq")
    pipe.xrange(key("rowlog"), min=f"({cursor.partition('/')[0]}")


def rows_after(cursor: str, replies: list[Any]) -> RowRead | None:
    """The rows logged after `cursor`, from the replies of `queue_log_read`; None where the log has
    a gap (the partition is then read whole)."""
    _, written, entries = replies
    seen = int(cursor.partition("/")[2])
    numbers = [int(values[b"n"]) for _, values in entries]
    # Every entry since the cursor, none missing, up to the count read first.
    if (numbers != list(range(seen + 1, seen + 1 + len(numbers)))
            or (numbers[-1] if numbers else seen) < int(written or 0)):
        return None
    # A row is absolute: of one written several times since the cursor (a group re-credited in
    # batch after batch), the last is the one to put, and the others are neither decoded nor put.
    latest: dict[tuple[int, str], str] = {}
    for _, values in entries:
        for bucket, field, value in orjson.loads(values[b"r"]):
            latest[(bucket, field)] = value
    rows = [(bucket, *state_format.decode_row_field(field), shard_format.decode_row(value))
            for (bucket, field), value in latest.items()]
    return RowRead(log_cursor(entries[-1]) if entries else cursor, False, rows)


def read_whole(client: Any, key: Callable[..., str], since_bucket: int) -> RowRead:
    """Every row of the partition whose keys `key` names from `since_bucket` on, and the cursor of
    the log's end, read with a Redis `client`."""
    # The lease and the log's end first: every commit after them is logged, and rows read
    # after them are at least as new (reading one again is harmless).
    pipe = client.pipeline(transaction=False)
    pipe.set(key("reader"), 1, px=READER_LEASE_MS)
    pipe.hget(key("meta"), "rowseq")
    pipe.xrevrange(key("rowlog"), count=1)
    _, written, last = pipe.execute()
    buckets: list[Any] = list(client.zrangebyscore(key("aggidx"), since_bucket, "+inf"))
    rows = shard_format.read_buckets(client, key, map(int, buckets))
    newest = last[0] if last else None
    cursor = (log_cursor(newest) if newest is not None and int(newest[1][b"n"]) >= int(written or 0)
              else f"{text(newest[0]) if newest is not None else '0-0'}/{int(written or 0)}")
    return RowRead(cursor, True, rows)


def log_cursor(entry: Any) -> str:
    entry_id, values = entry
    return f"{text(entry_id)}/{int(values[b'n'])}"


def text(value: Any) -> str:
    """A reply as text (bytes decoded)."""
    return value.decode() if isinstance(value, bytes) else str(value)
