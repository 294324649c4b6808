"""Figures several benches report: percentiles of timings, Redis memory by key kind.

    timings([0.012, 0.015, 0.031])      # {"p50_ms": 15.0, "p99_ms": 31.0}
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

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


def memory_by_kind(client: redis.Redis, namespace: str) -> dict[str, int]:
    """MEMORY USAGE of a namespace's keys, summed by kind (the key's name after the hash tag)."""
    kinds: dict[str, int] = {}
    keys = list(client.scan_iter(match=f"{{{namespace}:*", count=1000))
    for first in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[first:first + 1000]:
            pipe.memory_usage(key, samples=0)
        for key, used in zip(keys[first:first + 1000], pipe.execute(), strict=True):
            kind = key.decode().split("}:", 1)[1].split(":", 1)[0]
            kinds[kind] = kinds.get(kind, 0) + int(used or 0)
    return kinds
