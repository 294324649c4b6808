"""Redis memory of the impression ids with the dedup horizon, against remembering them for the
whole retention horizon, in the same run.

    python -m bench.dedup_bench [--events 200000] [--hours 4]

The service's batch pipeline (`harness.pipeline.Writer`: parse, load, engine, commit to a real
local redis-server) reads the Zipf workload of the service bench spread over --hours of event
time, with the default windows (the longest 1 day, so every impression is held) and the event
clock, once with the default `dedup_horizon` and once with it set to the horizon (what every
release before it remembered). Reported: MEMORY USAGE of the impression-id set and of all keys,
per impression held. Rewrites the "Impression ids" section of bench/RESULTS.md.
"""

from __future__ import annotations

import sys
from typing import Any

import redis

from bench.harness.figures import memory_by_kind
from bench.harness.pipeline import Writer
from bench.harness.results import argument_parser, publish
from bench.harness.servers import redis_server
from bench.harness.workloads import workload
from stream_ndcg.config import Settings
from stream_ndcg.setting_values import format_duration


def held_bytes(messages: list[bytes], settings: Settings) -> dict[str, Any]:
    Writer(settings).write_all(messages)
    kinds = memory_by_kind(redis.Redis.from_url(settings.redis_url), settings.key_namespace)
    impressions = sum(1 for m in messages if b'"impression"' in m)
    label = format_duration(settings.dedup_horizon)
    label += " (the horizon)" if settings.dedup_horizon == settings.horizon else ""
    return {"dedup_horizon": label, "impressions": impressions,
            # Format 7's sorted set, or format 8's shards and their directory.
            "imp_bytes_per_impression": round(sum(kinds.get(kind, 0) for kind in ("imp", "ids", "iddir"))
                                              / impressions, 1),
            "total_bytes_per_impression": round(sum(kinds.values()) / impressions, 1)}


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--hours", type=float, default=4.0)
    args = parser.parse_args()
    rate = args.events / (args.hours * 3_600)
    messages = [value for _, value in workload(args.events, seed=11, judged_share=0.03, rate=rate)]
    with redis_server("dedup") as server:
        flags = {"clock": "event", "redis_url": server.url}
        default = Settings.load(flags={**flags, "namespace": "dedup0"})
        configurations = [default, Settings.load(flags={**flags, "namespace": "dedup1",
                                                        "dedup_horizon": str(default.horizon)})]
        runs = [held_bytes(messages, settings) for settings in configurations]
    now, before = runs
    result = {"bench": "dedup", "events": args.events, "hours": args.hours, "runs": runs,
              "imp_ratio": round(now["imp_bytes_per_impression"] / before["imp_bytes_per_impression"], 3)}
    rows = [f"| {run['dedup_horizon']} | {run['impressions']} | {run['imp_bytes_per_impression']} | "
            f"{run['total_bytes_per_impression']} |" for run in runs]
    section = "\n".join([
        "## Impression ids", "",
        f"`python -m bench.dedup_bench --events {args.events} --hours {args.hours:g}`: the service's batch pipeline "
        f"into a local redis-server, the Zipf workload over {args.hours:g} h of event time, default windows (1d), "
        "clock=event; both runs in the same process.", "",
        "| dedup horizon | impressions held | impression-id bytes per impression | all keys, bytes per impression |",
        "|---|---:|---:|---:|", *rows, "",
        f"Impression ids now / before: **{result['imp_ratio']}**. At steady state with a 1-day window the ids "
        "are a dedup horizon's worth (1h of 24), whatever the traffic.", ""])
    return publish(args.results, section, result)


if __name__ == "__main__":
    sys.exit(main())
