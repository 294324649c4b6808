"""The service's memory against the impressions it holds: its peak RSS with N and with N/10
impressions held, next to each other in one run.

    python -m bench.memory_bench [--impressions 1000000] [--state-cache-mib N] [--quick]

Each size is the benches' workload (few judgments) caught up from offset 0 by `stream-ndcg run`
on the event clock into an emptied Redis (`harness.held_memory`), on one Kafka broker and one
redis-server. The service's settings are its defaults but for `--state-cache-mib`, so that the
figure can also be taken with the cache bounded by its groups alone. Prints one JSON line last,
rewrites the "Memory against impressions held" section of bench/RESULTS.md and records its
figures for bench/targets.py.
"""

from __future__ import annotations

import json
import platform
import sys
from typing import Any

from bench.harness.held_memory import held_memory
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import kafka_and_redis, redis_version
from stream_ndcg.config import Settings


def main() -> int:
    parser = argument_parser(__doc__, quick=True)
    parser.add_argument("--impressions", type=int, default=1_000_000, help="N, the larger of the two sizes")
    parser.add_argument("--state-cache-mib", type=int, default=Settings().state_cache_mib,
                        help="the service's state_cache_mib (default: its own default)")
    args = parser.parse_args()
    if args.quick:
        args.impressions = 20_000
    settings = {"state_cache_mib": str(args.state_cache_mib)}
    result: dict[str, Any] = {"bench": "memory", "settings": {**settings,
                                                             "state_cache_groups": Settings().state_cache_groups}}
    with kafka_and_redis("memory") as (kafka, server):
        memory: dict[str, Any] = {}
        for held in (args.impressions // 10, args.impressions):
            memory[str(held)] = held_memory(kafka.bootstrap, server.url, held, **settings)
            print(json.dumps(memory[str(held)]), file=sys.stderr)
    small, large = memory[str(args.impressions // 10)], memory[str(args.impressions)]
    memory["rss_ratio"] = round(large["service_peak_rss_mib"] / small["service_peak_rss_mib"], 3)
    memory["impressions_held"], memory["impressions_held_small"] = large["impressions"], small["impressions"]
    result["memory"] = memory
    return publish(args.results, section(result, args.impressions), result)


def section(result: dict[str, Any], asked: int) -> str:
    mem, settings = result["memory"], result["settings"]
    rows = ["## Memory against impressions held", "",
            f"- date: {stamp()}; machine: {platform.machine()}, CPython {platform.python_version()}, "
            f"redis-server {redis_version()}, Kafka on loopback",
            f"- command: `{command(__file__)}`",
            f"- the service's settings: its defaults (clock=event) with state_cache_mib={settings['state_cache_mib']}, "
            f"state_cache_groups={settings['state_cache_groups']}",
            "",
            "| impressions held | service peak RSS | Redis bytes per impression |",
            "|---:|---:|---:|"]
    for held in (asked // 10, asked):
        figures = mem[str(held)]
        rows.append(f"| {figures['impressions']} | {figures['service_peak_rss_mib']} MiB | "
                    f"{figures['redis_bytes_per_impression']} |")
    rows += ["", f"Service peak RSS, {mem['impressions_held']} vs {mem['impressions_held_small']} impressions held: "
                 f"**{mem['rss_ratio']}** (target: within 1.2).", ""]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
