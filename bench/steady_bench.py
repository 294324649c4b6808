"""Redis memory and the service's memory once the longest window has passed: flat, or growing?

    python -m bench.steady_bench [--horizons 4] [--rate 1000]

`stream-ndcg run --clock event` with small windows (30s and 1m of 5-second buckets, 10s of
grace: a 70-second horizon, the default day shrunk to a minute) reads the Zipf workload of the
service bench, produced live at --rate events per second and stamped with the time it is sent,
for --horizons horizons. At the end of each horizon: Redis's used_memory, the service's resident
set (VmRSS, what it holds now, not its peak) and the keys Redis holds. The figure is the larger
over the smaller of the last two horizons (target: within 1.1). The dedup horizon is 20s and the
judgments' TTL one horizon, short like the windows: with the default 30 days, a judged query's
state outlives the run. Rewrites the "Memory over time" section of bench/RESULTS.md.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from typing import Any

import redis

from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import kafka_and_redis
from bench.harness.service_process import ServiceProcess, counted, resident_bytes
from bench.harness.workloads import create_topic
from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator

SETTINGS = {"clock": "event", "windows": "30s,1m", "bucket": "5s", "grace": "10s", "dedup_horizon": "20s",
            "judgment_ttl": "70s"}
HORIZON_S = 70


def run(horizons: int, rate: float) -> dict[str, Any]:
    with kafka_and_redis("steady") as (kafka, server):
        client = redis.Redis.from_url(server.url)
        topic = create_topic(kafka.bootstrap, "steady")
        service = ServiceProcess(kafka.bootstrap, server.url, topic, "steady", **SETTINGS)
        service.await_ready()
        stop = threading.Event()
        sent = [0]

        def load() -> None:
            spec = SimulationSpec(events=10**9, seed=13, queries=20_000, rate=rate, max_delay_ms=30_000)
            messages = Simulator(spec, clock=lambda: int(time.time() * 1000)).messages()
            sent[0] = produce(kafka.bootstrap, topic, itertools.takewhile(lambda _: not stop.is_set(), messages),
                              paced=True, rate=rate)

        producer = threading.Thread(target=load, daemon=True)
        started = time.monotonic()
        producer.start()
        samples = []
        try:
            for horizon in range(1, horizons + 1):
                time.sleep(max(0.0, started + horizon * HORIZON_S - time.monotonic()))
                samples.append({"horizon": horizon, "redis_used_bytes": int(client.info("memory")["used_memory"]),
                                "service_rss_bytes": resident_bytes(service.process.pid),
                                "redis_keys": int(client.dbsize()), "events_taken": counted(client, "steady")})
                print(json.dumps(samples[-1]), file=sys.stderr)
        finally:
            stop.set()
            producer.join(timeout=60)
            service.stop()
            client.close()
    last, before = samples[-1], samples[-2]
    return {"rate": rate, "horizon_s": HORIZON_S, "samples": samples, "events_sent": sent[0],
            "redis_ratio": round(max(last["redis_used_bytes"], before["redis_used_bytes"])
                                 / min(last["redis_used_bytes"], before["redis_used_bytes"]), 3),
            "rss_ratio": round(max(last["service_rss_bytes"], before["service_rss_bytes"])
                               / min(last["service_rss_bytes"], before["service_rss_bytes"]), 3)}


def section(result: dict[str, Any]) -> str:
    rows = [
        "## Memory over time",
        "",
        f"`{command(__file__)}`, {stamp()}: "
        f"`stream-ndcg run` with {', '.join(f'{k}={v}' for k, v in SETTINGS.items())} (a {result['horizon_s']} s "
        f"horizon), the Zipf workload produced live at {result['rate']:g} events/s and stamped with the time it "
        "is sent; one Kafka broker and redis-server on loopback.",
        "",
        "| end of horizon | Redis used_memory | service RSS | Redis keys | events taken in |",
        "|---:|---:|---:|---:|---:|",
    ]
    for sample in result["samples"]:
        rows.append(f"| {sample['horizon']} | {sample['redis_used_bytes'] / 2**20:.1f} MiB | "
                    f"{sample['service_rss_bytes'] / 2**20:.1f} MiB | {sample['redis_keys']} | "
                    f"{sample['events_taken']} |")
    rows += ["", f"Last two horizons, larger over smaller: Redis **{result['redis_ratio']}**, service RSS "
             f"**{result['rss_ratio']}** (target: within 1.1 each).", ""]
    return "\n".join(rows)


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--horizons", type=int, default=4)
    parser.add_argument("--rate", type=float, default=1000.0)
    args = parser.parse_args()
    if args.horizons < 3:
        parser.error("--horizons must be at least 3: the first horizon fills the windows")
    result = run(args.horizons, args.rate)
    return publish(args.results, section(result), result)


if __name__ == "__main__":
    sys.exit(main())
