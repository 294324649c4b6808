"""The cost targets of issue #30, each declared once, checked against the figures the benches
recorded: the "Targets (issue #30)" section of bench/RESULTS.md.

    python -m bench.targets [--results bench/RESULTS.md]

Runs last in `make bench`. Reads the results the benches recorded beside the results file
(RESULTS.json, see bench/harness/results.py) and prints, per target, the measured figure, the
bound and whether it is met. A figure no bench recorded (the bench not run, or a phase of it that
failed) is shown as missing, never filled in; each line names the run its figure comes from.
"""

from __future__ import annotations

import json
import operator
import string
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from bench.harness.results import argument_parser, recorded, stamp, write_section

HEADING = "## Targets (issue #30)"


class Direction(Enum):
    """How a measured figure is compared with its bound."""

    AT_LEAST = ">="
    AT_MOST = "<="
    UNDER = "<"

    @property
    def holds(self) -> Callable[[float, float], bool]:
        return {Direction.AT_LEAST: operator.ge, Direction.AT_MOST: operator.le, Direction.UNDER: operator.lt}[self]


@dataclass(frozen=True)
class Target:
    """One target: the bench that measures it, where its figure is in that bench's result (keys,
    then list indexes), what the figure is, and the bound it is held to. `on` says what the
    figure was measured on, a format string over the bench's result ("{throughput[events]}")."""

    name: str
    bench: str
    path: tuple[str | int, ...]
    definition: str
    direction: Direction
    bound: float
    unit: str = ""
    on: str = ""

    def measured(self, result: Mapping[str, Any]) -> float | None:
        """The figure in a bench's result; None if it is not there (or is not a number)."""
        found: Any = result
        for step in self.path:
            try:
                found = found[step]
            except (KeyError, IndexError, TypeError):
                return None
        return float(found) if isinstance(found, int | float) and not isinstance(found, bool) else None

    def met(self, figure: float) -> bool:
        return self.direction.holds(figure, self.bound)

    def describe(self, result: Mapping[str, Any]) -> str:
        """What the figure was measured on, or "" where the result lacks what `on` names."""
        fields = [name for _, name, _, _ in string.Formatter().parse(self.on) if name]
        try:
            return self.on.format(**result) if fields else self.on
        except (KeyError, IndexError, TypeError, ValueError):
            return ""


TARGETS = (
    Target("service throughput", "service", ("throughput", "ratio"),
           "events/s of `stream-ndcg run` catching up from offset 0 / events/s of a bare kafka-python consumer "
           "(read_committed, + json.loads) on the same topic", Direction.AT_LEAST, 0.5,
           on="{throughput[events]} events"),
    Target("service CPU per event", "service", ("throughput", "cpu_ratio"),
           "process CPU time per event of the service / of the bare consumer, in the same catch-ups",
           Direction.AT_MOST, 3, on="{throughput[events]} events"),
    Target("Redis per impression, service workload", "state", ("service", "bytes_per_impression"),
           "MEMORY USAGE of every key / impressions held, the service bench's workload through the service's "
           "batch pipeline (the state bench; Redis's `used_memory` reads about a tenth more, its allocator's share)",
           Direction.AT_MOST, 150, " bytes", on="{service[impressions]} impressions held"),
    Target("Redis per impression, sparse workload", "state", ("sparse", "bytes_per_impression"),
           "MEMORY USAGE of every key, drill-down rows included / impressions held, the drill-down bench's "
           "workload (100,000 distinct queries) through the service's batch pipeline (the state bench)",
           Direction.AT_MOST, 300, " bytes", on="{sparse[impressions]} impressions held"),
    Target("service RSS, 10x the impressions held", "memory", ("memory", "rss_ratio"),
           "the service's peak RSS with N impressions held / with N/10 (N = 1,000,000 for the target)",
           Direction.AT_MOST, 1.2, on="{memory[impressions_held]} vs {memory[impressions_held_small]} impressions"),
    Target("judgment-to-metric p99", "latency", ("latency", "p99_ms"),
           "produce time of a judgment to the response of the first scrape of /metrics that shows its change, "
           "99th percentile, under a paced load of half the highest paced rate the service keeps up with",
           Direction.UNDER, 150, " ms",
           on="{latency[probes]} probes at {latency[load_events_per_s]} events/s, half the sustained "
              "{sustained[events_per_s]}"),
    Target("drill-down upkeep", "service", ("throughput", "drilldown_ratio"),
           "events/s of the service with the drill-down rows kept / with drilldown=false", Direction.AT_LEAST, 0.9,
           on="{throughput[events]} events"),
    Target("replay vs pytrec_eval", "replay", ("replay_time_over_pytrec_eval_time",),
           "time of `stream-ndcg replay`'s pipeline / pytrec_eval's evaluate, the same impressions at k=5,10",
           Direction.AT_MOST, 5, on="{events} events"),
    Target("scale-out, CPU per event", "service", ("throughput", "scale_cpu_ratio"),
           "service CPU-seconds per million events, two instances of one group / one instance",
           Direction.AT_MOST, 1.1,
           on="{throughput[events]} events, partitions per instance {throughput[two_instances_partitions]} at the "
              "end, spread evenly from the start of the count: {throughput[two_instances_spread_evenly]}"),
)


def figure(value: float, unit: str) -> str:
    """A figure as its bench recorded it, to three decimals at most: a ratio of 1.005 held to 1.1
    must not read as 1."""
    return f"{round(value, 3):g}{unit}"


def measurement(target: Target, entries: Mapping[str, Any]) -> float | None:
    """The target's figure in what its bench recorded; None if that bench or figure is not there."""
    entry = entries.get(target.bench)
    return None if entry is None else target.measured(entry["result"])


def row(target: Target, entries: Mapping[str, Any]) -> str:
    """The target's line of the table: measured, target, met?, and the run the figure comes from."""
    bound = f"{target.direction.value} {target.bound:g}{target.unit}"
    value = measurement(target, entries)
    entry = entries.get(target.bench)
    if entry is None:
        return f"| {target.name} | missing | {bound} | - | no run of `{target.bench}` recorded |"
    if value is None:
        part = entry["result"].get(target.path[0])
        error = f": {part['error']}" if isinstance(part, dict) and "error" in part else ""
        return f"| {target.name} | missing | {bound} | - | not in `{entry['command']}`, {entry['date']}{error} |"
    on = target.describe(entry["result"])
    source = f"`{entry['command']}`, {entry['date']}" + (f"; {on}" if on else "")
    return f"| {target.name} | {figure(value, target.unit)} | {bound} | {'yes' if target.met(value) else 'no'} | " \
           f"{source} |"


def section(entries: Mapping[str, Any]) -> str:
    """The targets section from the recorded entries (bench name -> its recorded run)."""
    values = [(target, measurement(target, entries)) for target in TARGETS]
    met = sum(1 for target, value in values if value is not None and target.met(value))
    missing = sum(1 for _, value in values if value is None)
    return "\n".join([
        HEADING,
        "",
        f"`python -m bench.targets`, {stamp()}: each target of issue #30 against the figure its bench recorded "
        "(bench/RESULTS.json); every ratio is to a baseline taken in the same run of that bench. "
        f"Met: {met} of {len(TARGETS)}; not measured: {missing}.",
        "",
        "| target | measured | target | met? | from |",
        "|---|---:|---|---|---|",
        *[row(target, entries) for target in TARGETS],
        "",
        "What each figure is:",
        "",
        *[f"- {target.name}: {target.definition}." for target in TARGETS],
        "",
    ])


def main() -> int:
    args = argument_parser(__doc__).parse_args()
    entries = recorded(args.results)
    # Written, not published: the table is made of the benches' figures and records none of its own.
    write_section(args.results, section(entries))
    print(json.dumps({"targets": {t.name: measurement(t, entries) for t in TARGETS}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
