"""The stored form of drill-down rows: their text, and since state format 8 each bucket's shards.

A row's text is its sums as `sums_text.numbers_text` writes them (`encode_row`; format 8's
with repeats, `encode_row_8`); `decode_row` reads those and format 6's. Format 7 kept a
partition's rows of one bucket in one hash, ``<segment>\\x1f<query>`` -> the row's text: hundreds
of rows, most texts over 64 bytes, so a hashtable (about 60 bytes of dict entry and headers a row).
Format 8 keeps them in shards the commit script names and grows (`shard_scripts.SHARDED_ROWS`):

    {ns:P}:rowdir:<bucket>        HASH  n: the shard count (a power of two), c: the fields the shards
                                        hold, k: the segments interned, <segment> -> its index
    {ns:P}:rows:<bucket>:<i>      HASH  the rows of the queries whose `shard_of` is i:
                                        <index>|<query>      the row's text, led by its piece count
                                                             (chr(48 + count)), then its first 63 bytes
                                        <index>~<j>|<query>  its j-th piece of 64 bytes

A shard holds about 32 to 64 fields (the script doubles the shards past 64 on average), each at
most 64 bytes: a listpack with the server's defaults. The text is format 7's (`numbers_text`), and
the row log keeps format 7's fields, so a log reader is unchanged. A row written in format 8 is
removed from its bucket's format 7 hash in the same script; a reader reads both, format 8 last.

The impression ids of format 8 are sharded the same way, by slots of buckets that go whole behind
the dedup horizon (`shard_scripts.SHARDED_IDS`, looked up by `shard_scripts.SEEN_IDS`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from stream_ndcg.rows import Row
from stream_ndcg.state.format import decode_row as format_6_row
from stream_ndcg.state.format import decode_row_field
from stream_ndcg.state.sums_text import numbers_of, numbers_text

# The directory's own fields; every other field of it is a segment key, which is JSON.
DIRECTORY_FIELDS = (b"n", b"c", b"k")


def encode_row(row: Row) -> str:
    """A drill-down row as format 7 writes it (`state.format` names its values): `numbers_text`."""
    return numbers_text(row)


def encode_row_8(row: Row) -> str:
    """A drill-down row as format 8 writes it: `numbers_text` with repeats."""
    return numbers_text(row, repeats=True)


def decode_row(raw: bytes | str) -> Row:
    """A row of any format: one without a dense or empty number in C, as format 6 reads it."""
    data = raw if isinstance(raw, bytes) else raw.encode()
    if data and b"|" not in data and b",," not in data and data[:1] != b"," and data[-1:] != b",":
        return format_6_row(data)
    return tuple(numbers_of(data.decode()))


def name_hash(name: str) -> int:
    """The first 32 bits of a name's SHA-1: its shard among any count is this modulo the count.
    The store sends it with each impression id, so that the scripts do not hash the ids again."""
    return int.from_bytes(hashlib.sha1(name.encode(), usedforsecurity=False).digest()[:4], "big")


def shard_of(name: str, count: int) -> int:
    """The shard of a query (its row) among `count`: the commit script's `shard` (first 32 bits of its SHA-1)."""
    return name_hash(name) % count


def shard_count(directory: Mapping[Any, Any]) -> int:
    """How many shards a bucket's directory (bytes from the Redis client) says its rows are in."""
    return int(directory.get(b"n", 0))


def segments_of(directory: Mapping[Any, Any]) -> dict[bytes, str]:
    """index -> segment key, of a bucket's directory."""
    return {index: segment.decode() for segment, index in directory.items() if segment not in DIRECTORY_FIELDS}


def rows_of(directory: Mapping[Any, Any], shards: Sequence[Mapping[Any, Any]]) -> dict[tuple[str, str], str]:
    """(segment, query id) -> the row's text (`compact_format.decode_row` reads it), of a bucket's
    directory and shards as the Redis client returns them."""
    segments = segments_of(directory)
    pieces: dict[tuple[bytes, bytes], dict[int, bytes]] = {}
    for shard in shards:
        for name, value in shard.items():
            head, _, query = name.partition(b"|")
            index, _, piece = head.partition(b"~")
            pieces.setdefault((index, query), {})[int(piece) if piece else 0] = value
    rows: dict[tuple[str, str], str] = {}
    for (index, query), held in pieces.items():
        first = held.get(0)
        if first is None:
            continue
        # Pieces past the count are left from a longer text the row had before: not its own.
        count = first[0] - 48
        text = first[1:] + b"".join(held[j] for j in range(1, count))
        rows[(segments[index], query.decode())] = text.decode()
    return rows


def bucket_rows(bucket: int, old: Mapping[Any, Any], directory: Mapping[Any, Any],
                shards: Sequence[Mapping[Any, Any]]) -> list[tuple[int, str, str, Row]]:
    """(bucket, segment, query id, row) of a bucket: its format 7 hash `old`, then its format 8
    directory and shards (a row written in format 8 is no longer in the old hash, but a reader
    that reads both between two commits still takes the newer)."""
    texts: dict[tuple[str, str], bytes | str] = {decode_row_field(field): value for field, value in old.items()}
    texts.update(rows_of(directory, shards))
    return [(bucket, segment, query_id, decode_row(value)) for (segment, query_id), value in texts.items()]


def read_buckets(client: Any, key: Callable[..., str], buckets: Iterable[int]) -> list[tuple[int, str, str, Row]]:
    """The rows of a partition's `buckets`, read with a Redis `client` (`key` names the partition's
    keys): both formats' hashes of each bucket, then the shards its directory counts."""
    wanted = list(buckets)
    pipe = client.pipeline(transaction=False)
    for bucket in wanted:
        pipe.hgetall(key("rows", bucket))
        pipe.hgetall(key("rowdir", bucket))
    replies = pipe.execute()
    directories = replies[1::2]
    pipe = client.pipeline(transaction=False)
    for bucket, directory in zip(wanted, directories, strict=True):
        for shard in range(shard_count(directory)):
            pipe.hgetall(key("rows", bucket, shard))
    shards = iter(pipe.execute())
    return [row for bucket, old, directory in zip(wanted, replies[::2], directories, strict=True)
            for row in bucket_rows(bucket, old, directory, [next(shards) for _ in range(shard_count(directory))])]
