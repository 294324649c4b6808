"""What the compiled core buys: the batch pipeline on the compiled build against the pure one.

    python -m bench.core_bench [--events 30000] [--rounds 5]

Writes the same workload (the service bench's) through this tree's batch pipeline
(`harness.pipeline.Writer`: parse, load, engine, commit, on real Redis, without Kafka) as the
squares bench does, each run in a process of its own on a namespace of its own, alternated round
after round: the compiled build (installed by `pip install -e .`, which must have compiled it:
the bench stops otherwise) and the pure one (`STREAM_NDCG_PURE=1`, the same installed tree). Each
run is timed in its process's CPU time, as events per CPU-second; the ratio of the medians is the
compiled build's throughput over the pure one's, the baseline of the same run.

A third process per round runs the pure build with its sums of squares cut out, as the squares
bench's does (its cut patches the pure `ListSquares`, which a compiled native class refuses):
the compiled pipeline with its squares over the pure one without them reads how much of issue
#29's squares cost the compiled core pays back. It is not that target's reading, which is one
build with and without its squares (section Squares).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import workload

ROOT = Path(__file__).resolve().parents[1]
COMPILED, PURE, PURE_CUT = "compiled", "pure", "pure, squares cut out"
PURE_VARIABLE = "STREAM_NDCG_PURE"


def cut_squares() -> None:
    """Swap the engine's squares step for one that keeps nothing (in this process only)."""
    from stream_ndcg.list_squares import ListSquares

    def no_sums(self: ListSquares, *args: object, **kwargs: object) -> dict[str, float]:
        return {}

    def not_added(self: ListSquares, ranked: tuple[str, ...], count: int) -> None:
        return None

    ListSquares.sums = no_sums  # type: ignore[method-assign]
    ListSquares.added = not_added  # type: ignore[method-assign]


def child(url: str, namespace: str, messages_file: Path, cut: bool) -> None:
    """One run: every message through the pipeline; prints the build and events per CPU-second."""
    if cut:
        cut_squares()
    from bench.harness.pipeline import events_per_cpu_second
    from stream_ndcg.core_build import core_build

    print(core_build().core, events_per_cpu_second(url, namespace, messages_file.read_bytes().splitlines()))


def run(url: str, namespace: str, messages_file: Path, variant: str) -> float:
    env = {key: value for key, value in os.environ.items() if key != PURE_VARIABLE}
    env["PYTHONPATH"] = str(ROOT)
    if variant != COMPILED:
        env[PURE_VARIABLE] = "1"
    # -P: the working directory must not come before PYTHONPATH on sys.path.
    out = subprocess.run([sys.executable, "-P", "-m", "bench.core_bench", "--child", url, namespace,
                          str(messages_file), "cut" if variant == PURE_CUT else "kept"],
                         env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    build, rate = out.stdout.split()[-2:]
    expected = "compiled" if variant == COMPILED else "pure"
    if build != expected:
        raise SystemExit(f"the {variant} run ran the {build} core: is the compiled core built (pip install -e .)?")
    return float(rate)


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5] == "cut")
        return 0
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="stream-ndcg-core-bench-") as root, redis_server("core") as server:
        messages_file = Path(root, "messages.jsonl")
        messages_file.write_bytes(b"\n".join(value for _, value in workload(args.events, seed=29)))
        rates: dict[str, list[float]] = {COMPILED: [], PURE: [], PURE_CUT: []}
        for round_number in range(args.rounds):
            # Alternated, and the first of each round rotated too.
            order = list(rates)[round_number % 3:] + list(rates)[:round_number % 3]
            for name in order:
                namespace = f"c{round_number}-{list(rates).index(name)}"
                rates[name].append(run(server.url, namespace, messages_file, name))
    load_after = os.getloadavg()
    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratio = medians[COMPILED] / medians[PURE]
    against_cut = medians[COMPILED] / medians[PURE_CUT]
    rows = "\n".join(f"| {name} | {medians[name]:,.0f} | {', '.join(f'{v:,.0f}' for v in rates[name])} |"
                     for name in rates)
    section = f"""## Compiled core

`{command(__file__)}`, {stamp()}, redis-server on loopback: {args.events:,} events of the service
bench's workload through this tree's batch pipeline (no Kafka), ideal pool, on the compiled
core and on the pure one (`STREAM_NDCG_PURE=1`), and on the pure one with its squares cut out,
{args.rounds} runs each, alternated, each in a process of its own, timed in its CPU time. Load
average (1 min) {load_before[0]:.1f} before the runs, {load_after[0]:.1f} after.

| pipeline | median events per CPU-second | runs |
|---|---:|---|
{rows}

- compiled / pure: **{ratio:.3f}**
- compiled with its squares / pure without them: **{against_cut:.3f}** (issue #29 asks 0.95 of one
  build with and without; this is not that reading)
"""
    return publish(args.results, section, {"bench": "core", "medians": medians, "ratio": ratio,
                                           "compiled_over_pure_cut": against_cut, "runs": rates,
                                           "events": args.events,
                                           "load_average": [load_before[0], load_after[0]]})


if __name__ == "__main__":
    sys.exit(main())
