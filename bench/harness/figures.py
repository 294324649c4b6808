"""Figures several benches report: percentiles of timings, Redis memory by key kind, and what it holds.

    timings([0.012, 0.015, 0.031])      # {"p50_ms": 15.0, "p99_ms": 31.0}
    anatomy(client, "svc")["q"].encodings   # Counter({"hashtable": 4524})
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import redis


def percentile(values: Sequence[float], percent: int) -> float:
    """The nearest-rank percentile: the smallest of the values with at least `percent`% of them
    at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(percent * len(ordered) / 100) - 1)]


def timings(seconds: Sequence[float], *, unit: str = "ms", digits: int = 1) -> dict[str, float]:
    """The median and the 99th percentile of durations in seconds, in `unit` ("ms" or "s"), rounded."""
    scale = {"ms": 1000, "s": 1}[unit]
    return {f"p50_{unit}": round(scale * statistics.median(seconds), digits),
            f"p99_{unit}": round(scale * percentile(seconds, 99), digits)}


def keys_by_kind(client: redis.Redis, namespace: str) -> Iterator[tuple[str, bytes, int]]:
    """Each key of a namespace (SCAN) with its kind (the key's name after the hash tag, up to the
    next colon) and its MEMORY USAGE, asked for a thousand keys at a time in one pipeline."""
    keys = list(client.scan_iter(match=f"{{{namespace}:*", count=1000))
    for first in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[first:first + 1000]:
            pipe.memory_usage(key, samples=0)
        for key, used in zip(keys[first:first + 1000], pipe.execute(), strict=True):
            yield key.decode().split("}:", 1)[1].split(":", 1)[0], key, int(used or 0)


def memory_by_kind(client: redis.Redis, namespace: str) -> dict[str, int]:
    """MEMORY USAGE of a namespace's keys, summed by kind (`keys_by_kind`)."""
    kinds: dict[str, int] = {}
    for kind, _, used in keys_by_kind(client, namespace):
        kinds[kind] = kinds.get(kind, 0) + used
    return kinds


@dataclass
class KindAnatomy:
    """The keys of one kind (`memory_by_kind`'s kinds): how many, their MEMORY USAGE, how many
    fields (of hashes) or members (of sets and sorted sets) they hold and how long those are, how
    many of a hash's fields are too long for a listpack, and each encoding with its keys."""

    keys: int = 0
    used: int = 0
    fields: int = 0
    field_bytes: int = 0
    value_bytes: int = 0
    over_listpack_value: int = 0
    encodings: Counter[str] = field(default_factory=Counter)


def anatomy(client: redis.Redis, namespace: str) -> dict[str, KindAnatomy]:
    """Each kind of key of a namespace (`keys_by_kind`), taken apart: what a stored format
    spends its bytes on. A hash field counts as over the listpack limit when its name or value
    is longer than the server's `hash-max-listpack-value`: one such field turns its whole hash
    into a hashtable."""
    limit = int(str(client.config_get("hash-max-listpack-value")["hash-max-listpack-value"]))
    kinds: dict[str, KindAnatomy] = {}
    for kind_name, key, used in keys_by_kind(client, namespace):
        kind = kinds.setdefault(kind_name, KindAnatomy())
        kind.keys += 1
        kind.used += used
        kind.encodings[client.object("encoding", key).decode()] += 1
        held = client.type(key)
        if held == b"hash":
            for name, value in client.hgetall(key).items():
                kind.fields += 1
                kind.field_bytes += len(name)
                kind.value_bytes += len(value)
                kind.over_listpack_value += len(name) > limit or len(value) > limit
        elif held == b"zset":
            kind.fields += int(client.zcard(key))
        elif held == b"set":
            kind.fields += int(client.scard(key))
    return kinds
