"""How true the state cache's size estimate is: each cached state's real bytes against
`state.cache.estimated_bytes`, by the size of the state.

    python -m bench.cache_sizes_bench [--events 150000]

Writes the service bench's workload (seed 1, ideal pool) through this tree's batch pipeline
(`harness.pipeline.Writer`, on real Redis, without Kafka) with a state cache that holds every state,
tracing the process's allocations (tracemalloc). Then drops the states from the cache one at a
time: a state's real bytes are what its drop frees, everything it alone holds, the compiled core's
native objects included. Fits the real bytes by least squares to the parts the estimate counts
(per state, group, document in a group's ranks, distinct list, place in a list, judged document),
and writes the Catch-up size section's companion, "State cache estimate".
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from dataclasses import dataclass

import numpy as np

from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import workload
from stream_ndcg.config import Settings
from stream_ndcg.query_state import QueryState
from stream_ndcg.state.cache import estimated_bytes

# The parts a state's bytes are fitted to, in the order of the fit's coefficients.
PARTS = ("state", "group", "document in a group's ranks", "distinct list", "place in a list", "judged document")
# States by their distinct lists, as the table groups them.
CLASSES = ((1, 1), (2, 9), (10, 99), (100, 999), (1000, None))


@dataclass(frozen=True, slots=True)
class MeasuredState:
    real: int
    estimated: int
    # The state's count of each of PARTS.
    counts: tuple[int, ...]

    @property
    def lists(self) -> int:
        return self.counts[3]


def measure(events: int) -> list[MeasuredState]:
    from bench.harness.pipeline import Writer

    with redis_server("cache-sizes") as server:
        writer = Writer(Settings.load(environ={
            "STREAM_NDCG_REDIS_URL": server.url, "STREAM_NDCG_NAMESPACE": "sizes", "STREAM_NDCG_CLOCK": "event",
            "STREAM_NDCG_IDEAL": "pool", "STREAM_NDCG_STATE_CACHE_MIB": str(2**16),
            "STREAM_NDCG_STATE_CACHE_GROUPS": str(10**9)}))
        messages = [value for _, value in workload(events, seed=1)]
        tracemalloc.start()
        try:
            writer.write_all(messages)
            # The cache's own entries: the bench takes each state out as the cache evicts one.
            cache = writer.store._cache
            parts = [(key, _counts(entry[0]), estimated_bytes(entry[0])) for key, entry in cache._entries.items()]
            gc.collect()
            # A full collection empties the interpreter's free lists, and the first objects freed
            # after it refill them instead of being freed: refill them first, and collect no more.
            _fill_free_lists()
            gc.disable()
            measured = []
            for key, counts, estimated in parts:
                before = tracemalloc.get_traced_memory()[0]
                cache._drop(key)
                measured.append(MeasuredState(before - tracemalloc.get_traced_memory()[0], estimated, counts))
        finally:
            gc.enable()
            tracemalloc.stop()
    return measured


def _counts(state: QueryState) -> tuple[int, ...]:
    groups = state.groups.values()
    return (1, len(groups), sum(len(g.ranks) for g in groups), sum(len(g.lists) for g in groups),
            sum(len(ranked) for g in groups for ranked in g.lists), len(state.revisions))


def _fill_free_lists() -> None:
    """CPython 3.11 keeps up to 2,000 tuples of each length under 20, 100 floats, 80 lists and 80
    dicts for reuse."""
    tuples = [tuple(range(length)) for length in range(1, 20) for _ in range(2_000)]
    floats = [float(n) + 0.5 for n in range(100)]
    lists: list[list[int]] = [[] for _ in range(80)]
    dicts: list[dict[int, int]] = [{} for _ in range(80)]
    del tuples, floats, lists, dicts


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=150_000)
    args = parser.parse_args()
    states = measure(args.events)
    counts = np.array([s.counts for s in states], dtype=float)
    real = np.array([s.real for s in states], dtype=float)
    coefficients = np.linalg.lstsq(counts, real, rcond=None)[0]
    fitted = counts @ coefficients
    rows = []
    for low, high in CLASSES:
        chosen = [n for n, s in enumerate(states) if s.lists >= low and (high is None or s.lists <= high)]
        if not chosen:
            continue
        real_sum = float(real[chosen].sum())
        estimated_sum = float(sum(states[n].estimated for n in chosen))
        rows.append(f"| {_label(low, high)} | {len(chosen):,} | {real_sum / 2**20:.1f} | {estimated_sum / 2**20:.1f} "
                    f"| {real_sum / estimated_sum:.2f} | {real_sum / float(fitted[chosen].sum()):.2f} |")
    real_all, estimated_all = float(real.sum()), float(sum(s.estimated for s in states))
    section = f"""## State cache estimate

`{command(__file__)}`, {stamp()}, redis-server on loopback: {args.events:,} events of the service
bench's workload (seed 1, ideal pool) through this tree's batch pipeline (no Kafka), with a state
cache that holds every state, under tracemalloc; then each state dropped from the cache in turn,
its real bytes what the drop freed. Estimated: `estimated_bytes`, which bounds the cache
(`state_cache_mib`). Fit: least squares of the real bytes on the parts below.

| distinct lists in the state | states | real MiB | estimated MiB | real / estimated | real / fit |
|---|---:|---:|---:|---:|---:|
{chr(10).join(rows)}
| all | {len(states):,} | {real_all / 2**20:.1f} | {estimated_all / 2**20:.1f} | **{real_all / estimated_all:.2f}** | |

Fitted bytes: {", ".join(f"{part} {value:,.0f}" for part, value in zip(PARTS, coefficients, strict=True))}.
"""
    return publish(args.results, section, {
        "bench": "cache_sizes", "events": args.events, "states": len(states),
        "real_over_estimated": real_all / estimated_all,
        "fitted_bytes": dict(zip(PARTS, (round(float(c), 1) for c in coefficients), strict=True))})


def _label(low: int, high: int | None) -> str:
    if high is None:
        return f"{low:,} or more"
    return f"{low:,}" if high == low else f"{low:,}-{high:,}"


if __name__ == "__main__":
    sys.exit(main())
