"""What a /metrics scrape costs with a long window, many partitions and several replicas scraping.

    python -m bench.scrape_bench [--partitions 64] [--buckets 1440] [--variants 5] [--scrapes 200]

A real redis-server holds the aggregate sums of --partitions partitions, a 1-day window of
1-minute buckets (--buckets of them) and --variants segment values, written by the store's own
commit; windows 5m, 1h and 1d at k=5,10. Then a writer keeps committing (each round a few
partitions' current bucket, now and then a late change to an old one, the clock crossing into a
new bucket every few rounds) while:

1. one exporter scrapes: the full /metrics text (`generate_latest`), p50/p99, and the values it
   read from Redis per scrape; the baseline in the same run is the scrape of before (every bucket
   of the longest window of every partition read and summed: `StateStore.aggregates`);
2. --replicas exporters in processes of their own scrape at once, as the replicas of a
   Deployment each scraped by Prometheus do.

Each exporter first warms up as the service's does at start (`Exporter.warm_up`: every bucket
read once, then what changed meanwhile): its time is reported apart. Target: p99 < 100 ms,
values read proportional to windows x segments x k, not to buckets x partitions.
Prints one JSON line last and rewrites the "## Scrapes" section of bench/RESULTS.md.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import statistics
import sys
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from bench.harness.figures import timings
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.service_process import resident_bytes
from stream_ndcg import wiring
from stream_ndcg.config import Settings
from stream_ndcg.engine import BatchOutcome
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.state.base import Commit
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.vocabulary import (
    IMPRESSIONS,
    MOMENTS,
    dcg_at,
    dcg_squares_at,
    judged_at,
    ndcg_at,
    ndcg_squares_at,
    scored_at,
)
from stream_ndcg.windows import by_segment_values, window_means

START_MS = 1_763_683_200_000
SETTINGS = dict(k="5,10", windows="5m,1h,1d", grace="1h", clock="event", segment_labels="variant", bucket="1m")
# A commit every ROUND_S, the clock crossing a bucket every BUCKET_ROUNDS rounds.
ROUND_S = 0.05
BUCKET_ROUNDS = 20


def store_of(url: str, namespace: str) -> RedisStore:
    return wiring.redis_store(Settings.load(flags={**SETTINGS, "redis_url": url, "namespace": namespace}))


def window_view() -> WindowView:
    """The exporter's view of the state; its `pipeline` label is the default group id's, as it
    has always been in this bench (the label's length is part of a scrape's text)."""
    return WindowView.from_settings(Settings.load(flags=SETTINGS))


def sums_of(buckets: list[int], variants: int, rng: random.Random) -> dict[tuple[int, str, str], float]:
    """What a bucket's impressions add to the aggregates, for every variant."""
    out: dict[tuple[int, str, str], float] = {}
    for bucket in buckets:
        for v in range(variants):
            segment = json.dumps({"variant": f"v{v}"}, separators=(",", ":"))
            impressions = rng.randint(1, 40)
            out[(bucket, segment, IMPRESSIONS)] = float(impressions)
            out[(bucket, segment, MOMENTS)] = float(impressions)
            for k in (5, 10):
                scored = rng.randint(0, impressions)
                ndcg, dcg = rng.random(), 3 * rng.random()
                out[(bucket, segment, scored_at(k))] = float(scored)
                out[(bucket, segment, ndcg_at(k))] = scored * ndcg
                out[(bucket, segment, ndcg_squares_at(k))] = scored * ndcg * ndcg
                out[(bucket, segment, dcg_at(k))] = impressions * dcg
                out[(bucket, segment, dcg_squares_at(k))] = impressions * dcg * dcg
                out[(bucket, segment, judged_at(k))] = impressions * rng.random()
    return out


class Writer:
    """Commits through the store's own script, one partition at a time, the offsets counted."""

    def __init__(self, url: str, namespace: str, partitions: int) -> None:
        self.store = store_of(url, namespace)
        self.names = [f"events:{p}" for p in range(partitions)]
        self.epochs = {name: self.store.claim(name) for name in self.names}
        self.offsets: dict[str, int] = dict.fromkeys(self.names, 0)

    def commit(self, partition: str, aggregates: dict[tuple[int, str, str], float], clock_ms: int) -> None:
        expected = self.offsets[partition] or None
        self.offsets[partition] += 1
        outcome = BatchOutcome(aggregates=aggregates, clock_ms=clock_ms)
        self.store.commit([Commit(partition, self.epochs[partition], outcome, self.offsets[partition], expected)])


def exporter_of(url: str, namespace: str) -> tuple[Exporter, RedisStore]:
    store = store_of(url, namespace)
    return Exporter(CollectorRegistry(), store, window_view()), store


def timed_scrape(exporter: Exporter) -> float:
    started = time.perf_counter()
    generate_latest(exporter.registry)
    return time.perf_counter() - started


def full_read_scrape(store: RedisStore, view: WindowView) -> tuple[float, int]:
    """The scrape of before: every bucket of the longest window read and summed; (seconds, values read)."""
    started = time.perf_counter()
    now = store.clock_ms()
    assert now is not None
    oldest = min(view.window_buckets(now, w)[0] for w in view.windows_ms)
    aggregates = store.aggregates(since_bucket=oldest)
    by_segment = by_segment_values(aggregates, view.segment_labels)
    for window in view.windows_ms:
        first, last = view.window_buckets(now, window)
        for part in by_segment.values():
            window_means(part, view.cutoffs, range(first, last + 1).__contains__)
    seconds = time.perf_counter() - started
    # Values read from Redis: every partition's fields, before they are added up.
    return seconds, sum(len(sums) for read in store.read_aggregates({}, oldest) for sums in read.buckets.values())


def percentiles(times: list[float]) -> dict[str, float]:
    return {**timings(times), "max_ms": round(1000 * max(times), 1), "scrapes": len(times)}


def timed_warm_up(exporter: Exporter) -> float:
    started = time.perf_counter()
    exporter.warm_up()
    return time.perf_counter() - started


def replica(url: str, namespace: str, scrapes: int, interval_s: float, out: Any) -> None:
    """One replica's exporter in a process of its own: its warm-up, then `scrapes` scrapes."""
    exporter, _ = exporter_of(url, namespace)
    before = resident_bytes()
    warm_up = timed_warm_up(exporter)
    times = []
    for _ in range(scrapes):
        time.sleep(interval_s)
        times.append(timed_scrape(exporter))
    # What the exporter holds: the resident set grown from before its warm-up to after its scrapes.
    out.put({"warm_up_ms": round(1000 * warm_up, 1), **percentiles(times),
             "rss_grown_mib": round((resident_bytes() - before) / 2**20, 1)})


def main() -> int:
    parser = argument_parser(__doc__, quick=True)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--buckets", type=int, default=1440)
    parser.add_argument("--variants", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    if args.quick:
        args.partitions, args.buckets, args.scrapes = 8, 120, 20
    rng = random.Random(11)  # noqa: S311 - a workload, not a secret
    view = window_view()
    bucket_ms = view.bucket_ms
    first_bucket = START_MS // bucket_ms
    result: dict[str, Any] = {"bench": "scrape", "partitions": args.partitions, "buckets": args.buckets,
                              "variants": args.variants, "windows": "5m,1h,1d", "k": "5,10"}
    with redis_server("scrape") as server:
        writer = Writer(server.url, "scrape", args.partitions)
        clock = [(first_bucket + args.buckets) * bucket_ms - 1]
        started = time.perf_counter()
        for name in writer.names:
            for start in range(0, args.buckets, 240):
                buckets = list(range(first_bucket + start, first_bucket + min(args.buckets, start + 240)))
                writer.commit(name, sums_of(buckets, args.variants, rng), clock[0])
        result["seed_s"] = round(time.perf_counter() - started, 1)
        print(json.dumps({"seeded_s": result["seed_s"]}), file=sys.stderr)

        stop = threading.Event()

        def write_live() -> None:
            """A few partitions' current bucket each round; now and then a late change to an old one."""
            rounds = 0
            while not stop.wait(ROUND_S):
                rounds += 1
                if rounds % BUCKET_ROUNDS == 0:
                    clock[0] += bucket_ms
                current = clock[0] // bucket_ms
                for name in rng.sample(writer.names, min(4, len(writer.names))):
                    buckets = [current] + ([current - rng.randint(1, 600)] if rng.random() < 0.2 else [])
                    writer.commit(name, sums_of(buckets, args.variants, rng), clock[0])

        live = threading.Thread(target=write_live, daemon=True)
        live.start()
        exporter, store = exporter_of(server.url, "scrape")
        single: dict[str, Any] = {"warm_up_ms": round(1000 * timed_warm_up(exporter), 1)}
        values_read: list[int] = []
        reads = store.read_aggregates

        def counted(marks: Any, since_bucket: int) -> Any:
            got = list(reads(marks, since_bucket))
            values_read.append(sum(len(sums) for read in got for sums in read.buckets.values()))
            return got

        store.read_aggregates = counted  # type: ignore[method-assign]
        times, baseline, baseline_values = [], [], []
        baseline_store = store_of(server.url, "scrape")
        for _ in range(args.scrapes):
            time.sleep(ROUND_S)
            times.append(timed_scrape(exporter))
        for _ in range(max(5, args.scrapes // 20)):
            seconds, n = full_read_scrape(baseline_store, view)
            baseline.append(seconds)
            baseline_values.append(n)
        single.update(percentiles(times))
        single["values_read_per_scrape"] = {"median": statistics.median(values_read), "max": max(values_read)}
        single["full_read"] = {**percentiles(baseline), "values_read_per_scrape": statistics.median(baseline_values)}
        single["ratio_p99"] = round(single["p99_ms"] / single["full_read"]["p99_ms"], 3)
        result["one_exporter"] = single
        print(json.dumps(single), file=sys.stderr)

        queue: Any = multiprocessing.get_context("spawn").Queue()
        processes = [multiprocessing.get_context("spawn").Process(
            target=replica, args=(server.url, "scrape", args.scrapes // 2, ROUND_S * 2, queue))
            for _ in range(args.replicas)]
        for process in processes:
            process.start()
        replicas = [queue.get(timeout=1800) for _ in processes]
        for process in processes:
            process.join()
        stop.set()
        live.join()
        result["replicas"] = {"count": args.replicas, "each": replicas,
                              "p99_ms_worst": max(r["p99_ms"] for r in replicas)}
        print(json.dumps(result["replicas"]), file=sys.stderr)
        store.client.close()
        baseline_store.client.close()
    return publish(args.results, section(result), result)


def section(result: dict[str, Any]) -> str:
    one, replicas = result["one_exporter"], result["replicas"]
    full, read = one["full_read"], one["values_read_per_scrape"]
    each = ", ".join(f"{r['p99_ms']} ms" for r in replicas["each"])
    warm_ups = ", ".join(f"{r['warm_up_ms']} ms" for r in replicas["each"])
    grown = ", ".join(f"{r['rss_grown_mib']} MiB" for r in replicas["each"])
    return f"""## Scrapes

`{command(__file__)}`, {stamp()}, redis-server on
loopback: {result['partitions']} partitions, {result['buckets']} buckets of 1 minute (windows
{result['windows']}), {result['variants']} variants, k={result['k']}; a writer committing live meanwhile
(the clock crossing a bucket every {BUCKET_ROUNDS * ROUND_S:g} s, a fifth of the commits also changing an old bucket).

| scrape of /metrics | p50 | p99 | values read from Redis per scrape | target |
|---|---|---|---|---|
| running window sums (now) | {one['p50_ms']} ms | {one['p99_ms']} ms | median {read['median']}, max {read['max']} \
| p99 < 100 ms |
| every bucket read and summed (before, same run) | {full['p50_ms']} ms | {full['p99_ms']} ms \
| {full['values_read_per_scrape']} | |

- p99 ratio now / before: **{one['ratio_p99']}**. An exporter's warm-up at start (every bucket
  read once, then what changed meanwhile, before the first scrape): {one['warm_up_ms']} ms.
- {replicas['count']} replicas scraping at once, each in a process of its own: p99 {each}
  (target < 100 ms each); their warm-ups {warm_ups}, all at once; each process's resident set grew
  by {grown} from before its warm-up to after its scrapes (the sums it holds).
"""


if __name__ == "__main__":
    sys.exit(main())
