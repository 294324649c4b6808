"""`stream-ndcg judge` and `stream-ndcg ubi-bridge` against a real local Kafka and Redis, each
figure next to baselines of the same run.

    python -m bench.judge_bench [--events 200000] [--rounds 2] [--quick]

The workload: the simulator's searches with clicks (position-based model of hidden true grades,
`--clicks`), no rater judgments, about eleven hours of event time, so that `judge` with its
default settings (judge_interval 1h, click_bucket 1d) decides a judgment boundary every hour of it.

1. throughput, each catching up a topic from offset 0 (event clock), alternated round by round,
   best of `--rounds` each: a bare kafka-python consumer (read_committed, + json.loads), `run`,
   and `judge` (each judge round on a topic of its own: it publishes its judgments to the topic it
   reads); the issue's target is judge at least half of run's rate. Beside them, `judge` with
   judge_interval 1d, which decides at most one boundary over the stream: what the boundaries cost;
2. the same events as UBI 1.3.0 documents (a query per search, a click event per click, keyed by
   UBI query_id): `ubi-bridge` catching up, next to the bare consumer reading both UBI topics;
3. memory: Redis bytes per click the judge's state holds (MEMORY USAGE over its keys / clicks
   taken in), by key kind;
4. a cProfile of the judge's loop, and of the bridge's, run in this process over the same events:
   where their time goes.

Prints one JSON line last and rewrites the judge section of bench/RESULTS.md.
"""

from __future__ import annotations

import cProfile
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple
from urllib.request import urlopen

import orjson
import redis
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.figures import memory_by_kind
from bench.harness.profiles import markdown, shares
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import kafka_and_redis, redis_version
from bench.harness.service_process import ServiceProcess, cpu_seconds, service_rate
from bench.harness.workloads import BATCH, bare_consumer_rate, create_topic
from stream_ndcg import judge_service, ubi_bridge
from stream_ndcg.config import Settings
from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.state.judge_redis import RedisJudgeStore
from stream_ndcg.ubi import UbiCounts
from stream_ndcg.vocabulary import CLICK, JUDGMENT, MetricName, total

Messages = list[tuple[bytes, bytes]]
TARGET = 0.5
# The steps of the judge's loop and the bridge's in their profiles: (module, function) -> what it does.
JUDGE_STEPS = {("stream_ndcg.source.kafka", "poll"): "poll Kafka",
         ("stream_ndcg.click_judge", "add"): "apply impressions and clicks",
         ("stream_ndcg.judge_boundaries", "close"): "close a boundary (rank counts)",
         ("stream_ndcg.click_judge", "emit"): "decide a boundary (grade every pair)",
         ("stream_ndcg.click_judge", "changes"): "the batch's changes as plain data",
         ("stream_ndcg.state.judge_redis", "commit"): "commit (payload and Redis script)",
         ("stream_ndcg.judge_loop", "_publish"): "publish judgments",
         ("stream_ndcg.click_judge", "from_state"): "load the state (claims)"}
BRIDGE_STEPS = {("stream_ndcg.source.kafka", "poll"): "poll Kafka",
                ("stream_ndcg.ubi", "add_query"): "join a UBI query",
                ("stream_ndcg.ubi", "add_event"): "join a UBI event",
                ("stream_ndcg.ubi", "contract_message"): "the contract's messages",
                ("stream_ndcg.ubi_bridge", "send"): "send",
                ("stream_ndcg.ubi_bridge", "flush"): "flush (acks from the brokers)",
                ("stream_ndcg.source.kafka", "commit"): "commit offsets"}


def searches_and_clicks(events: int) -> Messages:
    """Zipf searches over 20,000 queries, two variants, and their clicks, at two searches per second
    of event time (the clicks come on top: eleven hours in 200,000 events); the simulator's rater
    judgments left out."""
    spec = SimulationSpec(events=events, seed=11, queries=20_000, list_length=10, judged_share=0.0,
                          unshown_judged_share=0.0, rate=2.0, clicks=True)
    return [(k, v) for k, v in Simulator(spec).messages() if b'"judgment"' not in v]


def ubi_documents(messages: Messages) -> tuple[Messages, Messages]:
    """The same searches and clicks as UBI documents: (queries, events), keyed by UBI query_id."""
    queries: Messages = []
    events: Messages = []
    for _, value in messages:
        event = orjson.loads(value)
        key = event["impression_id"].encode()
        timestamp = datetime.fromtimestamp(event["ts"] / 1000, UTC).isoformat(timespec="milliseconds")
        if event["type"] == "impression":
            queries.append((key, orjson.dumps({
                "application": "bench", "query_id": event["impression_id"], "client_id": "c",
                "user_query": event["query_id"], "timestamp": timestamp,
                "query_attributes": event["segment"], "query_response_hit_ids": event["results"]})))
        else:
            events.append((key, orjson.dumps({
                "application": "bench", "action_name": "click", "query_id": event["impression_id"],
                "client_id": "c", "timestamp": timestamp,
                "event_attributes": {"object": {"object_id": event["doc_id"]}}})))
    return queries, events


def judge_counts(client: redis.Redis, namespace: str, field: str = "counts") -> dict[str, int]:
    """What the judge of `namespace` has taken in, by type (its own judgments read back included);
    with `field` "grades", the pairs it holds a grade for, by grade."""
    counts: dict[str, int] = {}
    for meta in RedisJudgeStore(client, namespace=namespace).figures().values():
        for name, n in orjson.loads(meta.get(field, "{}")).items():
            counts[name] = counts.get(name, 0) + int(n)
    return counts


def judge_taken(client: redis.Redis, namespace: str) -> int:
    """The input's records the judge has taken in: all it counted but the judgments it read back."""
    counts = judge_counts(client, namespace)
    return sum(counts.values()) - counts.get(JUDGMENT, 0)


def bridge_taken(port: int) -> int:
    """UBI documents the bridge has read, by its /metrics."""
    try:
        body = urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()  # noqa: S310
    except OSError:
        return 0  # not serving yet
    return int(sum(sample.value for family in text_string_to_metric_families(body)
                   for sample in family.samples if sample.name == total(MetricName.UBI_DOCUMENTS)))


class Pace(NamedTuple):
    """A catch-up's records per second, and per CPU-second of the service's process: the second
    moves less with what else the shared machine runs meanwhile."""

    per_s: float
    per_cpu_s: float


def catch_up(service: ServiceProcess, progress: Callable[[], int], wanted: int, timeout: float = 600) -> Pace:
    """The pace `service` takes records in at, from the first counted to the `wanted`th; stops it."""
    first_at, first, first_cpu = 0.0, 0, 0.0
    deadline = time.monotonic() + timeout
    try:
        while True:
            done = progress()
            now = time.perf_counter()
            if done and not first_at:
                first_at, first, first_cpu = now, done, cpu_seconds(service.process.pid)
            if done >= wanted:
                return Pace((done - first) / (now - first_at),
                            (done - first) / (cpu_seconds(service.process.pid) - first_cpu))
            if time.monotonic() > deadline or service.process.poll() is not None:
                raise RuntimeError(f"{done} of {wanted} records after {timeout:.0f} s; log: {service.log}")
            time.sleep(0.05)
    finally:
        service.stop()


def judge_rate(bootstrap: str, redis_url: str, topic: str, total_records: int, namespace: str,
               **settings: str) -> Pace:
    client = redis.Redis.from_url(redis_url)
    try:
        service = ServiceProcess(bootstrap, redis_url, topic, namespace, command="judge", clock="event",
                                 judge_group_id=f"judge-{namespace}", **settings)
        return catch_up(service, lambda: judge_taken(client, namespace), total_records)
    finally:
        client.close()


def bridge_rate(bootstrap: str, redis_url: str, topics: tuple[str, str], total_records: int, name: str) -> Pace:
    service = ServiceProcess(bootstrap, redis_url, topics[0], name, command="ubi-bridge",
                             ubi_queries_topic=topics[0], ubi_events_topic=topics[1],
                             ubi_output_topic=f"{name}-out", ubi_group_id=f"bridge-{name}")
    return catch_up(service, lambda: bridge_taken(service.port), total_records)


def profile_judge(bootstrap: str, redis_url: str, topic: str, total_records: int) -> dict[str, Any]:
    """The judge's loop in this process under cProfile until it has taken the topic in."""
    namespace = "judge-profile"
    settings = Settings.load(flags={"bootstrap_servers": bootstrap, "redis_url": redis_url, "topics": topic,
                                    "namespace": namespace, "judge_group_id": namespace, "clock": "event",
                                    "batch_size": str(BATCH)})
    processor, exporter = judge_service.build(settings)
    client = redis.Redis.from_url(redis_url)
    profiler = cProfile.Profile()
    try:
        if not processor.start():
            raise RuntimeError("the profiled judge did not start")
        started = time.perf_counter()
        profiler.enable()
        while judge_taken(client, namespace) < total_records:
            processor.run_once()
        profiler.disable()
        elapsed = time.perf_counter() - started
    finally:
        processor.close()
        exporter.close()
        client.close()
    return {"seconds": round(elapsed, 1), "records": total_records, **shares(profiler, JUDGE_STEPS)}


def profile_bridge(bootstrap: str, topics: tuple[str, str], total_records: int) -> dict[str, Any]:
    """The bridge's loop in this process under cProfile until it has read both topics."""
    settings = Settings.load(flags={"bootstrap_servers": bootstrap, "ubi_queries_topic": topics[0],
                                    "ubi_events_topic": topics[1], "ubi_output_topic": "bridge-profile-out",
                                    "ubi_group_id": "bridge-profile", "batch_size": str(BATCH)})
    counts = UbiCounts()
    bridge, _, sink = ubi_bridge.build(settings, counts=counts)

    def stop_when_read() -> None:
        while sum(counts.read.values()) < total_records and not done.is_set():
            time.sleep(0.05)
        bridge.shutdown()

    done = threading.Event()
    watcher = threading.Thread(target=stop_when_read, daemon=True)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    watcher.start()
    try:
        profiler.enable()
        bridge.run()
        profiler.disable()
    finally:
        done.set()
        sink.close()
    return {"seconds": round(time.perf_counter() - started, 1), "records": total_records,
            **shares(profiler, BRIDGE_STEPS)}


def main() -> int:
    parser = argument_parser(__doc__, quick=True)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.events, args.rounds = 20_000, 1
    messages = searches_and_clicks(args.events)
    clicks = sum(1 for _, v in messages if b'"click"' in v)
    queries, events = ubi_documents(messages)
    times = [orjson.loads(value)["ts"] for _, value in messages]
    result: dict[str, Any] = {"bench": "judge", "events": len(messages), "clicks": clicks,
                              "impressions": len(messages) - clicks,
                              "event_hours": round((max(times) - min(times)) / 3_600_000, 1)}
    rates: dict[str, list[float]] = {name: [] for name in ("bare", "run", "judge", "judge_1d", "bare_ubi", "bridge")}
    paces: dict[str, list[Pace]] = {"run": [], "judge": [], "judge_1d": [], "bridge": []}
    with kafka_and_redis("judge") as (kafka, server):
        client = redis.Redis.from_url(server.url)
        topic = create_topic(kafka.bootstrap, "events")
        produce(kafka.bootstrap, topic, messages)
        ubi = (create_topic(kafka.bootstrap, "ubi_queries"), create_topic(kafka.bootstrap, "ubi_events"))
        produce(kafka.bootstrap, ubi[0], queries)
        produce(kafka.bootstrap, ubi[1], events)
        best_judge = ""
        for round_ in range(args.rounds):
            rates["bare"].append(bare_consumer_rate(kafka.bootstrap, topic, len(messages)).events_per_s)
            run = service_rate(kafka.bootstrap, server.url, topic, len(messages), f"run{round_}")
            paces["run"].append(Pace(run.events_per_s, run.events_per_s / run.cores["service"]))
            judged = create_topic(kafka.bootstrap, f"judge{round_}")
            produce(kafka.bootstrap, judged, messages)
            paces["judge"].append(judge_rate(kafka.bootstrap, server.url, judged, len(messages), f"judge{round_}"))
            if paces["judge"][-1] == max(paces["judge"]):
                best_judge = f"judge{round_}"
            daily = create_topic(kafka.bootstrap, f"judge-1d{round_}")
            produce(kafka.bootstrap, daily, messages)
            paces["judge_1d"].append(judge_rate(kafka.bootstrap, server.url, daily, len(messages), f"judge-1d{round_}",
                                                judge_interval="1d"))
            rates["bare_ubi"].append(bare_consumer_rate(kafka.bootstrap, ubi[0], len(queries) + len(events),
                                                        ubi[1]).events_per_s)
            paces["bridge"].append(bridge_rate(kafka.bootstrap, server.url, ubi, len(queries) + len(events),
                                               f"bridge{round_}"))
            for name, values in paces.items():
                rates[name].append(values[-1].per_s)
            print(json.dumps({name: round(values[-1]) for name, values in rates.items()}), file=sys.stderr)
        counts = judge_counts(client, best_judge)
        kinds = memory_by_kind(client, best_judge)
        taken_clicks = counts.get(CLICK, 0)
        result["memory"] = {"clicks": taken_clicks, "judge_bytes": sum(kinds.values()),
                            "bytes_per_click": round(sum(kinds.values()) / taken_clicks, 1),
                            "bytes_per_click_by_kind": {kind: round(n / taken_clicks, 1)
                                                        for kind, n in sorted(kinds.items())},
                            "graded_pairs": sum(judge_counts(client, best_judge, "grades").values())}
        print(json.dumps(result["memory"]), file=sys.stderr)
        profiled = create_topic(kafka.bootstrap, "profile")
        produce(kafka.bootstrap, profiled, messages)
        result["profile"] = profile_judge(kafka.bootstrap, server.url, profiled, len(messages))
        result["bridge_profile"] = profile_bridge(kafka.bootstrap, ubi, len(queries) + len(events))
        client.close()
    best = {name: max(values) for name, values in rates.items()}
    result["rates"] = {name: [round(r) for r in values] for name, values in rates.items()}
    result["per_cpu_s"] = {name: [round(p.per_cpu_s) for p in values] for name, values in paces.items()}
    cpu = {name: max(p.per_cpu_s for p in values) for name, values in paces.items()}
    result["ratios"] = {"judge_to_bare": round(best["judge"] / best["bare"], 3),
                        "judge_to_run": round(best["judge"] / best["run"], 3),
                        "judge_1d_to_run": round(best["judge_1d"] / best["run"], 3),
                        "run_to_bare": round(best["run"] / best["bare"], 3),
                        "bridge_to_bare": round(best["bridge"] / best["bare_ubi"], 3),
                        "bridge_to_run": round(best["bridge"] / best["run"], 3),
                        "judge_to_run_cpu": round(cpu["judge"] / cpu["run"], 3),
                        "judge_1d_to_run_cpu": round(cpu["judge_1d"] / cpu["run"], 3),
                        "bridge_to_run_cpu": round(cpu["bridge"] / cpu["run"], 3)}
    result["ubi_documents"] = len(queries) + len(events)
    return publish(args.results, section(result, args.rounds), result)


def section(result: dict[str, Any], rounds: int) -> str:
    rates, ratios, mem, prof = result["rates"], result["ratios"], result["memory"], result["profile"]

    def runs(name: str) -> str:
        return ", ".join(f"{r:,}" for r in rates[name]) + f" (best {max(rates[name]):,})"

    def cpu(name: str) -> str:
        return ", ".join(f"{r:,}" for r in result["per_cpu_s"][name]) + f" (best {max(result['per_cpu_s'][name]):,})"

    judge_ok = "met" if ratios["judge_to_run"] >= TARGET else "missed"
    judge_cpu_ok = "met" if ratios["judge_to_run_cpu"] >= TARGET else "missed"
    rows = [
        "## Judge and UBI bridge",
        "",
        f"- date: {stamp()}; machine: {platform.machine()}, {os.cpu_count()} cores (shared with other jobs, "
        f"noisy), CPython {platform.python_version()}, Kafka 4.1.1 (KRaft, one node), redis-server "
        f"{redis_version()}, all on loopback",
        f"- command: `{command(__file__)}` (via `make bench`)",
        f"- workload: {result['events']:,} events ({result['impressions']:,} searches, {result['clicks']:,} clicks "
        f"by the simulator's position-based model, no rater judgments), {result['event_hours']} hours of event time; "
        f"as UBI 1.3.0 "
        f"documents, {result['ubi_documents']:,} (a query per search, a click event per click); 4 partitions; "
        f"each service catching up from offset 0 on the event clock with its default settings and a batch of "
        f"{BATCH}; rounds: {rounds}, alternated",
        "",
        "| figure | records/s, each round | records per CPU-second of the service's process | ratio (best / best) "
        "| target |",
        "|---|---|---|---|---|",
        f"| bare kafka-python consumer + json.loads, read_committed | {runs('bare')} | | | |",
        f"| `run` on the same events | {runs('run')} | {cpu('run')} | {ratios['run_to_bare']} of bare | |",
        f"| `judge` on the same events | {runs('judge')} | {cpu('judge')} | {ratios['judge_to_bare']} of bare; "
        f"**{ratios['judge_to_run']} of run** ({ratios['judge_to_run_cpu']} per CPU-second) | >= {TARGET} of run "
        f"({judge_ok}; per CPU-second {judge_cpu_ok}) |",
        f"| `judge`, judge_interval 1d (at most one boundary in the stream) | {runs('judge_1d')} | {cpu('judge_1d')} | "
        f"{ratios['judge_1d_to_run']} of run ({ratios['judge_1d_to_run_cpu']} per CPU-second) | |",
        f"| bare consumer on the two UBI topics | {runs('bare_ubi')} | | | |",
        f"| `ubi-bridge` on the UBI documents | {runs('bridge')} | {cpu('bridge')} | {ratios['bridge_to_bare']} of "
        f"bare, {ratios['bridge_to_run']} of run ({ratios['bridge_to_run_cpu']} per CPU-second) | |",
        f"| judge's Redis state after a round | {mem['bytes_per_click']} bytes per click "
        f"({mem['judge_bytes']:,} bytes, {mem['clicks']:,} clicks) | | | |",
        "",
        "Redis bytes per click by key kind (MEMORY USAGE over the judge's keys): "
        + ", ".join(f"{kind} {value}" for kind, value in mem["bytes_per_click_by_kind"].items())
        + f"; the judge held a grade for {mem['graded_pairs']:,} (query, document) pairs at the end of that round.",
        "",
    ]
    rows += markdown(f"the judge's loop in the bench's process over the same events ({prof['records']:,} records in "
                     f"{prof['seconds']} s under the profiler)", prof)
    bridge = result["bridge_profile"]
    rows += markdown(f"the bridge's loop in the bench's process over the UBI documents ({bridge['records']:,} in "
                     f"{bridge['seconds']} s under the profiler)", bridge)
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
