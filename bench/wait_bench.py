"""What it costs to have each commit confirmed by a replica (`redis_wait_replicas`, Redis WAIT).

    python -m bench.wait_bench [--events 100000] [--rounds 3]

The service's batch pipeline (`harness.pipeline.Writer`: parse, load, engine, commit) writes the
service bench's Zipf workload into a redis-server that has one replica on the same machine, with
`redis_wait_replicas` 0 and 1 alternated, `--rounds` times each, each run into a namespace of its
own. Reported: events per second of each run and the ratio of the medians (with WAIT / without).
The target of issue #27: WAIT becomes the default only if it costs under 10% of throughput.
Rewrites the "Replicated commits" section of bench/RESULTS.md.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness.pipeline import Writer
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_version
from bench.harness.workloads import workload
from stream_ndcg.config import Settings
from stream_ndcg.devtools.redis_servers import RedisServer

TARGET = 0.9


def rate(messages: list[bytes], settings: Settings) -> float:
    writer = Writer(settings)
    started = time.perf_counter()
    writer.write_all(messages)
    return len(messages) / (time.perf_counter() - started)


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    messages = [value for _, value in workload(args.events, seed=17)]
    rates: dict[int, list[float]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="stream-ndcg-wait-bench-") as root, \
            RedisServer.start(Path(root, "master")) as master, \
            RedisServer.start(Path(root, "replica"), replica_of=master.port) as replica:
        replica.wait_until_in_sync()
        for round_number in range(args.rounds):
            for replicas in (0, 1):
                settings = Settings.load(flags={"clock": "event", "redis_url": master.url,
                                                "namespace": f"wait{replicas}-{round_number}",
                                                "redis_wait_replicas": str(replicas)})
                rates[replicas].append(rate(messages, settings))
    ratio = statistics.median(rates[1]) / statistics.median(rates[0])
    result = {"bench": "wait", "events": args.events, "rounds": args.rounds,
              "events_per_s": {str(k): [round(r) for r in v] for k, v in rates.items()},
              "ratio": round(ratio, 3), "target": TARGET}
    section = "\n".join([
        "## Replicated commits (WAIT)", "",
        f"`{command(__file__)}` at {stamp()}, redis-server {redis_version()} with one replica on the same "
        "machine; the service's batch pipeline in the bench's process, the Zipf workload, "
        f"{args.events:,} events a run, `redis_wait_replicas` 0 and 1 alternated.", "",
        "| redis_wait_replicas | events/s, each run | median |", "|---|---|---:|",
        *[f"| {k} | {', '.join(f'{r:,.0f}' for r in v)} | {statistics.median(v):,.0f} |" for k, v in rates.items()],
        "",
        f"With WAIT / without: **{ratio:.3f}** (target for making it the default: at least {TARGET}, "
        f"{'met' if ratio >= TARGET else 'missed'}).", ""])
    return publish(args.results, section, result)


if __name__ == "__main__":
    sys.exit(main())
