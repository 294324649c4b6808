"""What the service's memory and Redis's come to with a number of impressions held: the service
bench's memory phase and the memory bench both measure it so.

    figures = held_memory(kafka.bootstrap, redis_server.url, 100_000)
"""

from __future__ import annotations

from typing import Any

import redis

from bench.harness.figures import memory_by_kind
from bench.harness.service_process import service_rate
from bench.harness.workloads import create_topic, workload
from stream_ndcg.devtools.producer import produce


def held_memory(bootstrap: str, redis_url: str, held: int, **settings: str) -> dict[str, Any]:
    """`stream-ndcg run` (with `settings` by name) catching up a topic of about `held` impressions
    of the benches' workload (few judgments: the figures are about what impressions cost) into an
    emptied Redis: the impressions, Redis's growth per impression (by key kind too) and the
    service's peak RSS."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushall()
        baseline = int(client.info("memory")["used_memory"])
        topic = create_topic(bootstrap, f"memory-{held}")
        stream = workload(int(held * 1.2), seed=7, judged_share=0.03)
        impressions = sum(1 for _, v in stream if b'"impression"' in v)
        produce(bootstrap, topic, stream)
        # One instance, no other process's CPU counted: the figure is its memory.
        rss = service_rate(bootstrap, redis_url, topic, len(stream), f"memory{held}", 1, None, **settings).peak_rss
        used = int(client.info("memory")["used_memory"]) - baseline
        kinds = memory_by_kind(client, f"memory{held}")
        return {"impressions": impressions, "redis_bytes_per_impression": round(used / impressions),
                "service_peak_rss_mib": round(rss / 2**20, 1),
                "bytes_per_impression_by_kind": {kind: round(n / impressions, 1) for kind, n in sorted(kinds.items())}}
    finally:
        client.close()
