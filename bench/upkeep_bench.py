"""What the drill-down's rows cost the batch pipeline: events per CPU-second with drilldown = true
against drilldown = false, and where the difference goes.

    python -m bench.upkeep_bench [--events 50000] [--rounds 4] [--reader-batches 150]

Writes the service bench's workload through this tree's batch pipeline (`harness.pipeline.Writer`:
parse, load, engine, commit, on real Redis, without Kafka) with the garbage collector tuned as the
service tunes it, once with the drill-down's rows kept and once without, alternated round after
round, each run on a namespace of its own. With the rows kept, a reader does in the bench's thread
what the service's query figures do in theirs: after the first batch (the first scrape, which takes
the row log's lease), then every `--reader-batches` batches (150 batches of 500 events: about
the 5 s `query_figures_interval` of a service catching up at 15,000 events/s) and after the last
batch, it reads the rows
logged since its last read and brings the figures over queries up to date for the exporter's
windows (`Explorer.query_figures`).

Each run is timed in this process's CPU time (the reader's included), as events per CPU-second;
the ratio of the medians (rows kept / not) is the in-process upkeep, the baseline of the same run.
Beside it: the engine's, the commit payload's and the reader's CPU per event, and Redis's (INFO's
used_cpu_user + used_cpu_sys across the run: another process, which the ratio leaves out).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import redis

from bench.harness.pipeline import DEFAULT_GC_THRESHOLD, Writer, _TimedEngine
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import BATCH, workload
from stream_ndcg import service
from stream_ndcg.config import Settings
from stream_ndcg.core_build import core_build
from stream_ndcg.engine import Engine
from stream_ndcg.state.base import Commit

PARTS = ("engine", "payload", "reader")


def redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run(url: str, namespace: str, messages: list[bytes], drilldown: bool, reader_batches: int) -> dict[str, float]:
    """One run: every message through the pipeline; events per CPU-second, and the parts' CPU and
    Redis's in µs per event."""
    settings = Settings.load(environ={
        "STREAM_NDCG_REDIS_URL": url, "STREAM_NDCG_NAMESPACE": namespace, "STREAM_NDCG_CLOCK": "event",
        "STREAM_NDCG_DRILLDOWN": str(drilldown).lower(), "STREAM_NDCG_QUERY_FIGURES_INTERVAL": "0"})
    writer = Writer(settings)
    spent = dict.fromkeys(PARTS, 0.0)

    def timed(part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[part] += time.process_time() - started
        return call

    engine = writer.pipeline.engine
    # The engine's class is a native one in the compiled core, whose methods cannot be replaced.
    writer.pipeline.engine = cast(Engine, _TimedEngine(engine, timed("engine", engine.apply)))
    payload: Callable[[Commit], Any] = timed("payload", writer.store._payload)
    writer.store._payload = payload  # type: ignore[method-assign, assignment]
    reader = service.explorer(settings) if drilldown else None

    def read() -> None:
        assert reader is not None
        now = reader.view.now_ms(reader.store, reader.clock)
        if now is not None:
            totals = reader.window_totals.at(now)
            reader.query_figures(now, {window: list(totals[window]) for window in reader.view.windows_ms})

    client = redis.Redis.from_url(url)
    gc.collect()
    # As `stream-ndcg run` runs its batches.
    service.collect_garbage_for_batches()
    redis_before = redis_cpu_s(client)
    started = time.process_time()
    try:
        batches = range(0, len(messages), BATCH)
        for batch, first in enumerate(batches):
            writer.write(messages[first:first + BATCH])
            # And after the last batch: the service's refresher goes on reading what the run wrote.
            if reader is not None and (batch % reader_batches == 0 or batch == len(batches) - 1):
                timed("reader", read)()
        total = time.process_time() - started
    finally:
        gc.unfreeze()
        gc.set_threshold(*DEFAULT_GC_THRESHOLD)
    redis_s = redis_cpu_s(client) - redis_before
    client.flushall()
    client.close()
    events = len(messages)
    return {"events_per_cpu_s": events / total, "cpu_us": 1e6 * total / events,
            **{f"{part}_us": 1e6 * seconds / events for part, seconds in spent.items()},
            "redis_us": 1e6 * redis_s / events}


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reader-batches", type=int, default=150)
    args = parser.parse_args()
    messages = [value for _, value in workload(args.events, seed=1)]
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"kept": [], "off": []}
    with redis_server("upkeep") as server:
        for round_number in range(args.rounds):
            # Alternated, the first of each round taking turns.
            for name in (("kept", "off") if round_number % 2 else ("off", "kept")):
                runs[name].append(run(server.url, f"u{round_number}-{name}", messages, name == "kept",
                                      args.reader_batches))
    load_after = os.getloadavg()
    medians = {name: {figure: statistics.median(one[figure] for one in done) for figure in done[0]}
               for name, done in runs.items()}
    ratio = medians["kept"]["events_per_cpu_s"] / medians["off"]["events_per_cpu_s"]
    figures = ("cpu_us", *(f"{part}_us" for part in PARTS), "redis_us")
    table = "\n".join(
        f"| {name} | {medians[name]['events_per_cpu_s']:,.0f} | "
        f"{', '.join(f'{rate:,.0f}' for rate in (one['events_per_cpu_s'] for one in runs[name]))} | "
        + " | ".join(f"{medians[name][figure]:.1f}" for figure in figures) + " |"
        for name in runs)
    section = f"""## Drill-down upkeep

`{command(__file__)}`, {stamp()}, {core_build().describe()}, redis-server on loopback:
{args.events:,} events of the service bench's workload through this tree's batch pipeline (no
Kafka), with the drill-down's rows kept (a reader after the first batch, every
{args.reader_batches} batches and after the last, in the same thread) and without (drilldown = false), {args.rounds}
runs each, alternated, timed in the process's CPU time. Load average (1 min)
{load_before[0]:.1f} before the runs, {load_after[0]:.1f} after. Medians; µs per event.

| rows | events per CPU-second | runs | CPU | engine | commit payload | reader | Redis (its own CPU) |
|---|---:|---|---:|---:|---:|---:|---:|
{table}

- rows kept / drilldown = false, events per CPU-second: **{ratio:.3f}** (issue #30's target, on
  the service's throughput: at least 0.9)
"""
    return publish(args.results, section, {"bench": "upkeep", "ratio": ratio, "medians": medians, "runs": runs,
                                           "events": args.events, "reader_batches": args.reader_batches,
                                           "load_average": [load_before[0], load_after[0]]})


if __name__ == "__main__":
    sys.exit(main())
