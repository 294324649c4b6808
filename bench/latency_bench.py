"""Judgment-to-metric latency at half the service's sustained maximum rate (issue #30), against a
real local Kafka and Redis.

    python -m bench.latency_bench [--start-rate 2000] [--steps 5] [--step-seconds 20] [--probes 200] [--quick]
    python -m bench.latency_bench --probe-rate 1000 --results /tmp/trial/RESULTS.md   # two trees, one rate

About six minutes as it stands, two and a half with --quick (3 steps of 10 s, 30 probes).

1. sustained maximum: paced loads of the simulated workload (event times on the wall clock,
   judgments within a minute of their impressions), each for --step-seconds on a topic, a
   namespace and a `stream-ndcg run` of its own, from --start-rate doubled or halved until one
   is kept up with and one is not, then bisected (geometric mean) for the rest of --steps. A rate
   is kept up with when the load reached 95% of it and, when it ends, the service has committed
   all it was sent but at most a second's worth (the offsets in its store against the messages
   sent);
2. latency: a paced load of half that rate; a probe impression, then --probes judgments of it,
   one at a time; each one's time from its produce call to the response of the first scrape of
   /metrics that shows its change (the probe scrapes again as soon as a scrape answers), and
   that scrape's own duration, and how long the service's loop waited for a core meanwhile
   (runnable, not running: the machine's part); then the same with drilldown=false, which keeps
   no per-query rows and no query figures (with it on, a thread brings those up to date every
   query_figures_interval and the scrapes serve the last computation).

The paced load runs in a process of its own, so that its producer does not hold the bench's
GIL while the probe times its judgments; it still shares the machine's cores with the service,
Kafka and Redis, and its CPU time is reported beside theirs. Rewrites the "Judgment-to-metric
latency" section of bench/RESULTS.md and records its figures for bench/targets.py.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import os
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any
from urllib.request import urlopen

import redis
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.figures import timings
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import kafka_and_redis, redis_version
from bench.harness.service_process import ServiceProcess, core_wait_seconds, cpu_seconds
from bench.harness.workloads import create_topic
from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.vocabulary import MetricName

# A load is kept up with when, as it ends, the service is at most this many seconds of it behind,
# and the load itself reached at least this share of its rate.
BACKLOG_S = 1.0
REACHED = 0.95
# A probe not visible after this long means the service fell behind the load.
PROBE_TIMEOUT_S = 30.0


def _paced(bootstrap: str, topic: str, rate: float, stop: Event, sent: Synchronized[int]) -> None:
    """The load's process: the simulator's messages sent at `rate` until `stop`, counted in `sent`."""
    spec = SimulationSpec(events=10**9, seed=5, queries=20_000, rate=rate, start_ms=int(time.time() * 1000),
                          max_delay_ms=60_000)

    def counted() -> Iterator[tuple[bytes, bytes]]:
        # takewhile, not a filter: the simulated stream is endless.
        for n, message in enumerate(itertools.takewhile(lambda _: not stop.is_set(), Simulator(spec).messages())):
            sent.value = n + 1
            yield message

    sent.value = produce(bootstrap, topic, counted(), paced=True, rate=rate)


class PacedLoad:
    """The simulated workload sent to `topic` at `rate` events/s by a process of its own, while in
    the `with` block; `sent` is how many messages it has sent so far, `cpu` its CPU seconds."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._sent: Synchronized[int] = context.Value("q", 0)
        self._process = context.Process(target=_paced, args=(bootstrap, topic, rate, self._stop, self._sent),
                                        daemon=True)

    def __enter__(self) -> PacedLoad:
        self._process.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._process.join(timeout=60)

    @property
    def sent(self) -> int:
        return int(self._sent.value)

    @property
    def cpu(self) -> float:
        return cpu_seconds(self._process.pid) if self._process.pid is not None else 0.0


def kept_up(rate: float, reached: float, backlog: int) -> bool:
    """Whether a paced load of `rate` was kept up with: the load reached its rate, and when it
    ended the service was at most BACKLOG_S of it behind."""
    return reached >= REACHED * rate and backlog <= BACKLOG_S * rate


def next_rate(rate: float, lowest_failed: float | None, highest_kept: float | None) -> float:
    """The next rate to try: doubled until one is not kept up with, halved until one is, then the
    geometric mean of the highest kept up with and the lowest not."""
    if lowest_failed is None:
        return 2 * rate
    if highest_kept is None:
        return rate / 2
    return math.sqrt(lowest_failed * highest_kept)


@dataclass(frozen=True)
class Step:
    """One paced load of the search for the sustained maximum."""

    rate: float
    # Messages sent per second of the load, and how many the service had not taken in as it ended.
    reached: float
    backlog: int
    kept_up: bool
    # Cores each process kept busy during the load.
    cores: dict[str, float]


def busy(pids: dict[str, int], since: dict[str, float], seconds: float) -> dict[str, float]:
    return {name: round((cpu_seconds(pid) - since[name]) / seconds, 2) for name, pid in pids.items()}


def step(bootstrap: str, redis_url: str, servers: dict[str, int], rate: float, seconds: float, name: str) -> Step:
    """A paced load of `rate` on a topic and a service of its own, measured for `seconds` from the
    service's first records taken in (its start and first rebalance left out)."""
    topic = create_topic(bootstrap, name)
    service = ServiceProcess(bootstrap, redis_url, topic, name, clock="wall")
    try:
        service.await_ready()
        pids = {**servers, "service": service.process.pid}
        with PacedLoad(bootstrap, topic, rate) as load:
            deadline = time.monotonic() + 60
            while service.committed() == 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the service took nothing in for 60 s; its log: {service.log}")
                time.sleep(0.05)
            started, first, since = time.monotonic(), load.sent, {name: cpu_seconds(pid) for name, pid in pids.items()}
            load_cpu = load.cpu
            time.sleep(seconds)
            elapsed = time.monotonic() - started
            sent, taken = load.sent, service.committed()
            cores = {**busy(pids, since, elapsed), "load": round((load.cpu - load_cpu) / elapsed, 2)}
    finally:
        service.stop()
    reached = (sent - first) / elapsed
    return Step(round(rate), round(reached), sent - taken, kept_up(rate, reached, sent - taken), cores)


def sustained_maximum(bootstrap: str, redis_url: str, servers: dict[str, int], start: float, steps: int,
                      seconds: float) -> dict[str, Any]:
    """The highest paced rate kept up with (`next_rate`'s search), and every step of the search."""
    client = redis.Redis.from_url(redis_url)
    runs: list[Step] = []
    highest_kept: float | None = None
    lowest_failed: float | None = None
    rate = start
    for n in range(steps):
        # Each step on an empty Redis: the state of the last one is not this one's.
        client.flushall()
        runs.append(step(bootstrap, redis_url, servers, rate, seconds, f"ramp{n}"))
        print(json.dumps(asdict(runs[-1])), file=sys.stderr)
        if runs[-1].kept_up:
            highest_kept = max(rate, highest_kept or 0.0)
        else:
            lowest_failed = min(rate, lowest_failed or math.inf)
        rate = next_rate(rate, lowest_failed, highest_kept)
    client.close()
    return {"events_per_s": None if highest_kept is None else round(highest_kept),
            "lowest_not_kept_up": None if lowest_failed is None else round(lowest_failed),
            "step_seconds": seconds, "steps": [asdict(run) for run in runs]}


class Probe:
    """Judgments of one probe query sent to the service's topic, and the scrapes of /metrics that
    wait for each one's change."""

    WANTED = {"k": "5", "variant": "probe", "window": "5m"}

    def __init__(self, bootstrap: str, topic: str, service: ServiceProcess) -> None:
        self.topic = topic
        self.service = service
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1)
        self.sent = 0

    def send(self, event: dict[str, Any]) -> None:
        self.sent += 1
        self.producer.send(self.topic, key=b"probe", value=json.dumps(event).encode())
        self.producer.flush()

    def value(self) -> float | None:
        """The probe query's DCG sum in /metrics, or None if /metrics has none yet."""
        body = urlopen(self.service.metrics_url, timeout=10).read().decode()  # noqa: S310
        for family in text_string_to_metric_families(body):
            if family.name == MetricName.DCG_NUMERATOR:
                for sample in family.samples:
                    if self.WANTED.items() <= sample.labels.items():
                        return float(sample.value)
        return None

    def shown(self, timeout: float) -> bool:
        """Send the probe's impression and wait until /metrics shows it."""
        self.send({"type": "impression", "impression_id": "probe-1", "query_id": "probe",
                   "ts": int(time.time() * 1000), "results": ["p1", "p2", "p3"], "segment": {"variant": "probe"}})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.value() is not None:
                return True
            time.sleep(0.05)
        return False

    def judge(self, n: int) -> tuple[float, float] | None:
        """Judgment `n`'s time from its produce call to the response of the first scrape showing its
        change, and that scrape's duration; None if it is not shown within PROBE_TIMEOUT_S."""
        before = self.value()
        started = time.perf_counter()
        self.send({"type": "judgment", "query_id": "probe", "doc_id": "p2", "grade": 1 + n % 3,
                   "ts": int(time.time() * 1000), "event_id": f"probe-{n:06d}"})
        while True:
            scrape_started = time.perf_counter()
            try:
                shown = self.value() != before
            except OSError:
                # A scrape that timed out: the service is far behind, as PROBE_TIMEOUT_S will say.
                shown = False
            if shown:
                answered = time.perf_counter()
                return answered - started, answered - scrape_started
            if scrape_started - started > PROBE_TIMEOUT_S:
                return None
            time.sleep(0.002)

    def close(self) -> None:
        self.producer.close()


def latency(bootstrap: str, redis_url: str, servers: dict[str, int], rate: float, probes: int, name: str,
            **settings: str) -> dict[str, Any]:
    """The probes' figures under a paced load of `rate`, with what the service (with more
    `settings`) did meanwhile."""
    topic = create_topic(bootstrap, name)
    service = ServiceProcess(bootstrap, redis_url, topic, name, clock="wall", **settings)
    probe = Probe(bootstrap, topic, service)
    try:
        service.await_ready()
        pids = {**servers, "service": service.process.pid}
        with PacedLoad(bootstrap, topic, rate) as load:
            if not probe.shown(timeout=120):
                return {"error": "the probe impression never showed up in /metrics", "load_events_per_s": round(rate)}
            since = {name: cpu_seconds(pid) for name, pid in pids.items()}
            started, load_cpu = time.monotonic(), load.cpu
            batches = service.histogram(MetricName.BATCH_EVENTS), service.histogram(MetricName.BATCH_DURATION)
            sent_before = load.sent
            delays: list[float] = []
            scrapes: list[float] = []
            # How long the service's loop waited for a core while each probe waited for its change.
            waits: list[float] = []
            for n in range(probes):
                waited = core_wait_seconds(service.process.pid)
                timed = probe.judge(n)
                waits.append(core_wait_seconds(service.process.pid) - waited)
                if timed is None:
                    return {"error": f"probe {n} not visible after {PROBE_TIMEOUT_S:.0f} s: the service fell behind "
                                     f"the load ({load.sent + probe.sent - service.committed()} messages behind)",
                            "probes": n, "load_events_per_s": round(rate)}
                delays.append(timed[0])
                scrapes.append(timed[1])
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            cores = {**busy(pids, since, elapsed), "load": round((load.cpu - load_cpu) / elapsed, 2)}
            reached = (load.sent - sent_before) / (time.monotonic() - started)
            backlog = load.sent + probe.sent - service.committed()
            (count, records), (_, seconds) = (
                (after[0] - before[0], after[1] - before[1]) for after, before in
                zip((service.histogram(MetricName.BATCH_EVENTS), service.histogram(MetricName.BATCH_DURATION)),
                    batches, strict=True))
    finally:
        probe.close()
        service.stop()
    return {**timings(delays), "probes": probes, "load_events_per_s": round(rate),
            "reached_events_per_s": round(reached), "backlog_at_end": backlog,
            "scrape": timings(scrapes), "loop_waiting_for_a_core": timings(waits),
            # Not what the service would show alone (its scrapes' threads wait for cores too, and a
            # batch waits on Kafka and Redis, which wait as well), but the machine's part taken out
            # where it is measured.
            "less_the_loops_wait": timings([delay - wait for delay, wait in zip(delays, waits, strict=True)]),
            "cores": cores,
            "batch_records_mean": round(records / max(count, 1), 1),
            "batch_ms_mean": round(1000 * seconds / max(count, 1), 1)}


def main() -> int:
    parser = argument_parser(__doc__, quick=True)
    parser.add_argument("--start-rate", type=float, default=2000.0, help="the first paced rate tried, events/s")
    parser.add_argument("--steps", type=int, default=5, help="paced loads in the search for the sustained maximum")
    parser.add_argument("--step-seconds", type=float, default=20.0, help="how long each of them lasts")
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--probe-rate", type=float, help="probe at this rate, no sustained maximum searched for: "
                        "two trees compared at one rate (not the target's figure: keep it out of RESULTS.md)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.step_seconds, args.probes = 3, 10.0, 30
    result: dict[str, Any] = {"bench": "latency", "load_average_before": round(os.getloadavg()[0], 1)}
    with kafka_and_redis("latency") as (kafka, server):
        servers = {name: pid for name, pid in (("kafka", kafka.pid), ("redis", server.pid)) if pid is not None}
        result["sustained"] = (
            sustained_maximum(kafka.bootstrap, server.url, servers, args.start_rate, args.steps, args.step_seconds)
            if args.probe_rate is None else
            {"events_per_s": None, "lowest_not_kept_up": None, "step_seconds": 0, "steps": [],
             "probe_rate": args.probe_rate})
        maximum = result["sustained"]["events_per_s"] if args.probe_rate is None else 2 * args.probe_rate
        if maximum is None:
            result["latency"] = {"error": f"no paced rate tried was kept up with, down to {args.start_rate} / "
                                          f"2**{args.steps - 1} events/s"}
        else:
            # The same without the drill-down (no per-query rows written, no query figures brought up to date):
            # what they add to the latency.
            for key, settings in (("latency", {}), ("latency_without_drilldown", {"drilldown": "false"})):
                redis.Redis.from_url(server.url).flushall()
                result[key] = latency(kafka.bootstrap, server.url, servers, maximum / 2, args.probes, key,
                                      **settings)
                print(json.dumps(result[key]), file=sys.stderr)
    result["load_average_after"] = round(os.getloadavg()[0], 1)
    return publish(args.results, section(result), result)


def section(result: dict[str, Any]) -> str:
    sustained, lat = result["sustained"], result["latency"]
    rows = [
        "## Judgment-to-metric latency",
        "",
        f"- date: {stamp()}; machine: {platform.machine()}, {os.cpu_count()} cores (shared, noisy), CPython "
        f"{platform.python_version()}, Kafka 4.1.1 (KRaft, one node), redis-server {redis_version()}, all on loopback",
        f"- command: `{command(__file__)}`; the machine's load average (1 minute) {result['load_average_before']:.1f} "
        f"before, {result['load_average_after']:.1f} after (the cores are shared with other work)",
        f"- load: the simulated workload paced in a process of its own (20,000 Zipf queries, judgments within a "
        f"minute), `stream-ndcg run` with its default settings and `clock = wall`; a rate is kept up with when the "
        f"load reached {REACHED:.0%} of it and, after {sustained['step_seconds']:g} s, the service was at most "
        f"{BACKLOG_S:g} s of it behind",
        "",
        "| paced rate, events/s | reached, events/s | behind at the end, messages | kept up | cores busy |",
        "|---:|---:|---:|---|---|",
        *[f"| {run['rate']} | {run['reached']} | {run['backlog']} | {'yes' if run['kept_up'] else 'no'} | "
          + ", ".join(f"{name} {value}" for name, value in sorted(run["cores"].items())) + " |"
          for run in sustained["steps"]],
        "",
        f"Sustained maximum: {sustained['events_per_s'] or 'none found'} events/s"
        + (f" (the lowest rate not kept up with: {sustained['lowest_not_kept_up']})"
           if sustained["lowest_not_kept_up"] else "") + "."
        if "probe_rate" not in sustained else
        f"Sustained maximum: not searched for; probed at the rate given, {sustained['probe_rate']:g} events/s.",
        "",
        "| figure | measured | target |",
        "|---|---:|---|",
    ]
    if "error" in lat:
        rows.append(f"| judgment-to-metric latency | not measured: {lat['error']} | p99 < 150 ms |")
    else:
        rows += [
            f"| judgment-to-metric latency at {lat['load_events_per_s']} events/s "
            f"({'the rate given' if 'probe_rate' in sustained else 'half the sustained maximum'}), "
            f"produce to the response of the first scrape showing it | p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms "
            f"({lat['probes']} probes) | p99 < 150 ms |",
            f"| of which the scrape that showed it, from its request to its response | p50 {lat['scrape']['p50_ms']} "
            f"ms, p99 {lat['scrape']['p99_ms']} ms | |",
            f"| the service's loop waiting for a core meanwhile (runnable, not running: run_delay of "
            f"/proc/<pid>/schedstat) | p50 {lat['loop_waiting_for_a_core']['p50_ms']} ms, p99 "
            f"{lat['loop_waiting_for_a_core']['p99_ms']} ms per probe | |",
            f"| each probe's time less its loop's wait for a core | p50 {lat['less_the_loops_wait']['p50_ms']} ms, "
            f"p99 {lat['less_the_loops_wait']['p99_ms']} ms | |",
        ]
    without = result.get("latency_without_drilldown", {})
    if "p99_ms" in without:
        rows += [f"| the same with drilldown=false (no per-query rows, no query figures) | p50 "
                 f"{without['p50_ms']} ms, p99 {without['p99_ms']} ms; the scrape p50 {without['scrape']['p50_ms']} "
                 f"ms, p99 {without['scrape']['p99_ms']} ms; the loop waiting for a core p50 "
                 f"{without['loop_waiting_for_a_core']['p50_ms']} ms, p99 "
                 f"{without['loop_waiting_for_a_core']['p99_ms']} ms | |"]
    rows.append("")
    for title, run in (("", lat), (" with drilldown=false", without)):
        if "p99_ms" in run:
            rows += [f"Meanwhile{title}: the load reached {run['reached_events_per_s']} events/s and the service was "
                     f"{run['backlog_at_end']} messages behind it at the end; batches of {run['batch_records_mean']} "
                     f"records on average, {run['batch_ms_mean']} ms each; cores busy: "
                     + ", ".join(f"{name} {value}" for name, value in sorted(run["cores"].items())) + ".", ""]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
