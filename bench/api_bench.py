"""The drill-down API against a real local redis-server, each figure next to its target.

    python -m bench.api_bench [--queries 100000] [--requests 60]

1. upkeep: the service's batch pipeline (parse, load, engine, commit to Redis) over the same
   events with the drill-down rows kept and without (`drilldown` setting), alternated, best of
   three each: the throughput ratio (target >= 0.9);
2. answers: an hour of traffic with --queries distinct queries in the window, then the
   worst-queries request (1h, sorted by nDCG), the biggest movers (vs=previous) and the judging
   queue over HTTP, p50/p99 while a writer keeps committing live traffic (target p99 < 1 s);
   the first answer (the API reading every row once) is reported apart;
3. memory: Redis bytes per impression held, by key kind (MEMORY USAGE), the drill-down's rows
   and row log apart.

Prints one JSON line last and rewrites the drill-down section of bench/RESULTS.md.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.request import urlopen

import redis

from bench.harness.figures import memory_by_kind, timings
from bench.harness.pipeline import Writer
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from stream_ndcg.config import Settings
from stream_ndcg.devtools.ports import free_port
from stream_ndcg.drilldown.api import Api
from stream_ndcg.service import collect_garbage_for_batches, explorer

START_MS = 1_763_683_200_000
HOUR_MS = 3_600_000
SETTINGS = dict(k="5,10", windows="5m,1h", grace="1h", clock="event", segment_labels="variant")


def events(queries: int, seed: int, start_ms: int, span_ms: int, extra_share: float = 0.6) -> Iterator[bytes]:
    """Every query once, then Zipf-like repeats of the head (lists of 10 from 30 documents per
    query, two variants), and late judgments of a third of the head's documents; in time order."""
    rng = random.Random(seed)  # noqa: S311 - a workload, not a secret
    shown = [f"q{i}" for i in range(queries)]
    shown += [f"q{int(queries ** rng.random()) - 1}" for _ in range(int(queries * extra_share))]
    rng.shuffle(shown)
    step = span_ms / len(shown)
    for n, query_id in enumerate(shown):
        ts = start_ms + int(n * step)
        docs = rng.sample(range(30), 10)
        yield json.dumps({"type": "impression", "impression_id": f"{seed}-{n}", "query_id": query_id, "ts": ts,
                          "results": [f"d{d}" for d in docs], "segment": {"variant": rng.choice("AB")}}).encode()
        if rng.random() < 0.25:
            yield json.dumps({"type": "judgment", "query_id": query_id, "doc_id": f"d{rng.choice(docs)}",
                              "grade": rng.randint(0, 3), "ts": ts + 1}).encode()


def settings_of(url: str, namespace: str, drilldown: bool = True) -> Settings:
    return Settings.load(flags={**SETTINGS, "drilldown": drilldown, "redis_url": url, "namespace": namespace})


def feed(url: str, namespace: str, messages: list[bytes], drilldown: bool) -> float:
    """Events per second through the pipeline."""
    writer = Writer(settings_of(url, namespace, drilldown))
    started = time.perf_counter()
    writer.write_all(messages)
    return len(messages) / (time.perf_counter() - started)


def timed_get(url: str) -> float:
    started = time.perf_counter()
    with urlopen(url, timeout=60) as response:  # noqa: S310 - loopback
        response.read()
        assert response.status == 200
    return time.perf_counter() - started


def main() -> int:
    parser = argument_parser(__doc__, quick=True)
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=60)
    args = parser.parse_args()
    if args.quick:
        args.queries, args.requests = 5_000, 10
    result: dict[str, Any] = {"bench": "api"}
    # The writer below is the service's batch pipeline, and the service runs it with this collector.
    collect_garbage_for_batches()
    with redis_server("api") as server:
        client = redis.Redis.from_url(server.url)
        sample = list(events(args.queries // 4, seed=2, start_ms=START_MS, span_ms=HOUR_MS))
        rates: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(3):
            for drilldown in (True, False):
                rates[drilldown].append(feed(server.url, f"upkeep-{round_}-{drilldown}", sample, drilldown))
        with_rows, without = max(rates[True]), max(rates[False])
        result["upkeep"] = {"events": len(sample), "with_drilldown_events_per_s": round(with_rows),
                            "without_events_per_s": round(without), "ratio": round(with_rows / without, 3),
                            "target": ">= 0.9"}
        print(json.dumps(result["upkeep"]), file=sys.stderr)
        client.flushall()

        # Two hours, so that the previous hour is there to compare with.
        settings = settings_of(server.url, "api")
        writer = Writer(settings)
        history = list(events(args.queries, seed=3, start_ms=START_MS - HOUR_MS, span_ms=HOUR_MS))
        current = list(events(args.queries, seed=4, start_ms=START_MS, span_ms=HOUR_MS - 60_000))
        impressions = sum(1 for m in history + current if b'"impression"' in m)
        writer.write_all(history + current)
        memory = memory_by_kind(client, "api")
        result["memory"] = {"impressions": impressions,
                            "bytes_per_impression": {kind: round(used / impressions, 1)
                                                     for kind, used in sorted(memory.items())},
                            "total_bytes_per_impression": round(sum(memory.values()) / impressions, 1),
                            "drilldown_bytes_per_impression": round(
                                sum(memory.get(kind, 0) for kind in ("rows", "rowdir", "rowlog")) / impressions, 1)}
        print(json.dumps(result["memory"]), file=sys.stderr)

        # The drill-down's reader as `stream-ndcg run` builds it, on a store of its own.
        api = Api(explorer(settings))
        port = api.serve("127.0.0.1", free_port())
        base = f"http://127.0.0.1:{port}/api/v1"
        requests = {"worst_queries": f"{base}/queries?window=1h&k=10&sort=ndcg&order=asc&limit=50",
                    "movers": f"{base}/queries?window=1h&k=10&vs=previous&sort=change_ndcg&limit=50",
                    "judging_queue": f"{base}/judging-queue?window=1h&k=10&limit=100"}
        first = timed_get(requests["worst_queries"])
        live = list(events(2_000, seed=5, start_ms=START_MS + HOUR_MS - 60_000, span_ms=59_000, extra_share=0))
        stop = threading.Event()

        def trickle() -> None:
            """Live traffic while the requests run: the index reads what changed."""
            for start in range(0, len(live), 100):
                if stop.wait(0.25):
                    return
                writer.write(live[start:start + 100])

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        answers: dict[str, Any] = {"distinct_queries_in_window": args.queries, "first_answer_s": round(first, 3)}
        for name, url in requests.items():
            # The first of each kind builds its window's sums (or reads the queue's head states):
            # reported apart, as the cost of a page's first view.
            first_of_kind = timed_get(url)
            times = [timed_get(url) for _ in range(args.requests)]
            answers[name] = {"first_s": round(first_of_kind, 3), **timings(times, unit="s", digits=3),
                             "requests": len(times), "target": "p99 < 1 s"}
            print(json.dumps({name: answers[name]}), file=sys.stderr)
        stop.set()
        thread.join()
        api.close()
        result["answers"] = answers
        client.close()
    return publish(args.results, section(result), result)


def section(result: dict[str, Any]) -> str:
    upkeep, memory, answers = result["upkeep"], result["memory"], result["answers"]
    rows = "\n".join(f"| {name} | {a['first_s']} s | {a['p50_s']} s | {a['p99_s']} s | {a['requests']} | p99 < 1 s |"
                     for name, a in answers.items() if isinstance(a, dict))
    kinds = ", ".join(f"{kind} {value}" for kind, value in memory["bytes_per_impression"].items())
    return f"""## Drill-down API

`{command(__file__)}`, {stamp()}, redis-server on
loopback, the service's batch pipeline in process (no Kafka).

- Upkeep: {upkeep['with_drilldown_events_per_s']:,} events/s with the drill-down rows kept,
  {upkeep['without_events_per_s']:,} without (drilldown=false): ratio **{upkeep['ratio']}** (target >= 0.9),
  best of three alternated runs of {upkeep['events']:,} events each.
- Answers over HTTP, {answers['distinct_queries_in_window']:,} distinct queries in the 1h window, a writer
  committing live traffic meanwhile (in the same process, as in the service); the very first answer
  (reading every row once): {answers['first_answer_s']} s.

| request | first of its kind | p50 after | p99 after | requests | target |
|---|---|---|---|---|---|
{rows}

- Redis: {memory['total_bytes_per_impression']} bytes per impression held ({memory['impressions']:,}
  impressions), of which the drill-down's rows and row log {memory['drilldown_bytes_per_impression']}.
  By key kind: {kinds}.
"""


if __name__ == "__main__":
    sys.exit(main())
