"""Redis CPU of the commit script: the current state format's against format 7's, same events, same run.

    python -m bench.commit_cpu_bench [--events 60000] [--rounds 2] [--quick]

The service's batch pipeline (`harness.pipeline.Writer`: parse, load, engine, commit to a real
local redis-server, event clock) takes in the service bench's memory workload (`service_bench`:
Zipf queries, few judgments), once with `state_format = 7` and once with the current format, the
two alternating for --rounds rounds on one server (flushed between), so that both see the same
machine load. For each write: the server's CPU (INFO cpu, used_cpu_user + used_cpu_sys, before
and after) per 1,000 events, and the calls per 1,000 events of the commands that format 8's
shards add (INFO commandstats, reset before it). The ratio is the current format's CPU over
format 7's of the same round. Rewrites the "Stored state: Redis CPU" section of bench/RESULTS.md.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

import redis

from bench.harness.pipeline import Writer
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import workload
from stream_ndcg.config import Settings
from stream_ndcg.service import collect_garbage_for_batches
from stream_ndcg.state.format import FORMAT_VERSION

# The commands whose calls the shards multiply (re-expiry, fields moved when shards double, id lookups).
COUNTED = ("pexpire", "pttl", "exists", "hset", "hdel", "hget", "hmget", "hgetall", "hincrby", "hincrbyfloat",
           "zadd", "evalsha", "eval")
BASELINE_FORMAT = 7


def cpu_seconds(client: redis.Redis) -> float:
    """The server's CPU time so far, user and system."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def write_once(client: redis.Redis, url: str, stream: list[bytes], state_format: int) -> dict[str, Any]:
    """The stream written afresh in `state_format`: the server's CPU and the counted commands' calls,
    each per 1,000 events."""
    client.flushall()
    client.config_resetstat()
    before = cpu_seconds(client)
    Writer(Settings.load(flags={"redis_url": url, "namespace": "cpu", "clock": "event",
                                "state_format": str(state_format)})).write_all(stream)
    used = cpu_seconds(client) - before
    stats = client.info("commandstats")
    per_thousand = 1000 / len(stream)
    calls = {name: round(stats.get(f"cmdstat_{name}", {}).get("calls", 0) * per_thousand, 1) for name in COUNTED}
    return {"format": state_format, "cpu_ms_per_1000": round(used * 1000 * per_thousand, 2),
            "calls_per_1000": {name: n for name, n in calls.items() if n}}


def main() -> int:
    parser = argument_parser(__doc__, quick=True)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.events, args.rounds = 6_000, 1
    collect_garbage_for_batches()
    stream = [value for _, value in workload(args.events, seed=7, judged_share=0.03)]
    rounds: list[dict[str, Any]] = []
    with redis_server("commit-cpu") as server:
        client = redis.Redis.from_url(server.url)
        for _ in range(args.rounds):
            baseline = write_once(client, server.url, stream, BASELINE_FORMAT)
            current = write_once(client, server.url, stream, FORMAT_VERSION)
            rounds.append({"baseline": baseline, "current": current,
                           "ratio": round(current["cpu_ms_per_1000"] / baseline["cpu_ms_per_1000"], 2)})
            print(json.dumps(rounds[-1]), file=sys.stderr)
        client.close()
    result = {"bench": "commit_cpu", "events": len(stream), "format": FORMAT_VERSION, "rounds": rounds,
              "median_ratio": round(statistics.median(r["ratio"] for r in rounds), 2)}
    lines = ["| round | format | Redis CPU, ms per 1,000 events | ratio to format 7 | "
             "calls per 1,000 events (INFO commandstats) |", "|---:|---:|---:|---:|---|"]
    for n, measured in enumerate(rounds, 1):
        for side in ("baseline", "current"):
            write = measured[side]
            ratio = f"{measured['ratio']:.2f}" if side == "current" else "1"
            calls = ", ".join(f"{name} {count:g}" for name, count in write["calls_per_1000"].items())
            lines.append(f"| {n} | {write['format']} | {write['cpu_ms_per_1000']} | {ratio} | {calls} |")
    section = "\n".join([
        "## Stored state: Redis CPU", "",
        f"- date: {stamp()}; command: `{command(__file__)}`; the service's batch pipeline in process into one "
        f"local redis-server, the event clock; {len(stream):,} events of the service workload written in format "
        f"{BASELINE_FORMAT} and format {FORMAT_VERSION} alternately, the server flushed before each.",
        "- Redis CPU is INFO cpu's used_cpu_user + used_cpu_sys across the write; the ratio is format "
        f"{FORMAT_VERSION}'s over format {BASELINE_FORMAT}'s of the same round: median "
        f"{result['median_ratio']:.2f}.", "",
        *lines, ""])
    return publish(args.results, section, result)


if __name__ == "__main__":
    sys.exit(main())
