"""What bringing the drill-down's query figures up to date costs a scrape: the row logs of every
partition read in one round trip (`StateStore.read_all_rows`) against one round trip per partition.

    python -m bench.rowlog_bench [--partitions 16] [--scrapes 200]

A real redis-server holds --partitions partitions of simulated traffic (event clock). Then, for
each scrape, a writer commits a few events to every partition and two explorers on the same store
answer `Explorer.query_figures` for the 5m and 1h windows: one reading the partition list and then
each partition's row log in a round trip of its own (as before), one reading them all at once.
Which goes first alternates; their figures must be equal. Prints the p50/p99 of each.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from bench.harness.servers import redis_server
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.drilldown.explorer import Explorer
from stream_ndcg.engine import Engine
from stream_ndcg.events import parse_event
from stream_ndcg.exporter import WindowView
from stream_ndcg.metric import Measure
from stream_ndcg.pipeline import BatchPipeline
from stream_ndcg.state.base import RowRead, StateStore
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.state.redis_reads import connect

BUCKET_MS, HORIZON_MS = 60_000, 3_600_000
MEASURE = Measure(cutoffs=(5, 10))
# Events per partition before the first scrape, and committed to each before every scrape.
FIRST_EVENTS, SCRAPE_EVENTS = 200, 10


class PartitionByPartition:
    """The store as the explorer read its rows before: the partition list, then each partition's rows."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_all_rows(self, cursors: Mapping[str, str | None], since_bucket: int) -> dict[str, RowRead]:
        return {p: self._store.read_rows(p, cursors.get(p), since_bucket) for p in self._store.partitions()}


class Writer:
    """Commits each partition's share of the simulated messages through the service's pipeline."""

    def __init__(self, store: RedisStore, partitions: int) -> None:
        self.pipeline = BatchPipeline(store, Engine(MEASURE, BUCKET_MS, horizon_ms=HORIZON_MS), event_clock=True)
        self.names = [f"events:{p}" for p in range(partitions)]
        self.epochs = {name: store.claim(name) for name in self.names}
        self.offsets = dict.fromkeys(self.names, 0)

    def commit(self, messages: Sequence[bytes]) -> None:
        for at, name in enumerate(self.names):
            share = messages[at::len(self.names)]
            expected = self.offsets[name] or None
            self.offsets[name] += len(share)
            self.pipeline.apply(name, self.epochs[name], [parse_event(m) for m in share], self.offsets[name],
                                expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()
    partitions, scrapes = args.partitions, args.scrapes
    spec = SimulationSpec(events=partitions * (FIRST_EVENTS + scrapes * SCRAPE_EVENTS), seed=3, queries=2000,
                          rate=200.0)
    messages = [value for _, value in Simulator(spec).messages()]
    with redis_server("rowlog") as server:
        store = RedisStore(connect(server.url), namespace=f"rowlog-{uuid.uuid4().hex[:6]}", bucket_ms=BUCKET_MS,
                           horizon_ms=HORIZON_MS, state_ttl_ms=HORIZON_MS, wall_clock=False)
        writer = Writer(store, partitions)
        writer.commit(messages[:partitions * FIRST_EVENTS])
        view = WindowView(cutoffs=MEASURE.cutoffs, windows_ms=(300_000, 3_600_000), bucket_ms=BUCKET_MS,
                          segment_labels=(), event_clock=True)
        wanted: dict[int, list[tuple[str, ...]]] = {window: [()] for window in view.windows_ms}
        explorers = {"one round trip per partition": Explorer(PartitionByPartition(store), view, MEASURE, HORIZON_MS),
                     "one round trip for all": Explorer(store, view, MEASURE, HORIZON_MS)}
        seconds: dict[str, list[float]] = {name: [] for name in explorers}
        start = partitions * FIRST_EVENTS
        for scrape in range(-1, scrapes):
            if scrape >= 0:
                writer.commit(messages[start + scrape * partitions * SCRAPE_EVENTS:
                                       start + (scrape + 1) * partitions * SCRAPE_EVENTS])
            now = store.clock_ms()
            assert now is not None
            figures = []
            for name in (list(explorers) if scrape % 2 == 0 else list(reversed(explorers))):
                started = time.perf_counter()
                figures.append(explorers[name].query_figures(now, wanted))
                if scrape >= 0:  # the first answer reads every row whole: not a scrape's cost
                    seconds[name].append(time.perf_counter() - started)
            assert figures[0] == figures[1]
        store.client.close()
    for name, times in seconds.items():
        times.sort()
        print(f"{partitions} partitions, {name}: scrape's query figures p50 {statistics.median(times) * 1000:.2f} ms,"
              f" p99 {times[max(0, round(len(times) * 0.99) - 1)] * 1000:.2f} ms over {len(times)} scrapes")


if __name__ == "__main__":
    main()
