"""What keeping the sums of squares costs (issue #29's target: at most 5% of throughput).

    python -m bench.squares_bench [--events 30000] [--rounds 5]

Writes the same workload (the service bench's) through this tree's batch pipeline
(`harness.pipeline.Writer`: parse, load, engine, commit, on real Redis, without Kafka) with the
squares kept and with them cut out, each run in a process of its own on a namespace of its own, the
two alternated round after round, under the pool ideal (the default; under the list ideal a list's
squares come with the terms it is scored for anyway). Cut out is done here, in the bench's child
alone: the engine's squares step (`ListSquares`) is swapped for one that keeps none, so no square
is found, stored or exported; the service has no such switch. Both run the pure core
(`STREAM_NDCG_PURE=1`): the cut patches `ListSquares`, which the compiled core's native class
refuses (bench/core_bench.py sets the compiled pipeline against these). Each run is timed in its process's
CPU time (what the wait for a CPU on a shared machine does not move), as events per CPU-second;
the ratio of the medians is the share of the throughput the squares leave, against the target's
0.95.
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
TARGET = 0.95
KEPT, CUT = "squares kept", "squares cut out"


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
    """One run: every message through the pipeline; prints events per CPU-second of this process."""
    if cut:
        cut_squares()
    from bench.harness.pipeline import events_per_cpu_second

    print(events_per_cpu_second(url, namespace, messages_file.read_bytes().splitlines()))


def run(url: str, namespace: str, messages_file: Path, cut: bool) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT), STREAM_NDCG_PURE="1")
    # -P: the working directory must not come before PYTHONPATH on sys.path.
    out = subprocess.run([sys.executable, "-P", "-m", "bench.squares_bench", "--child", url, namespace,
                          str(messages_file), "cut" if cut else "kept"],
                         env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return float(out.stdout.split()[-1])


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5] == "cut")
        return 0
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stream-ndcg-squares-bench-") as root, redis_server("squares") as server:
        messages_file = Path(root, "messages.jsonl")
        messages_file.write_bytes(b"\n".join(value for _, value in workload(args.events, seed=29)))
        rates: dict[str, list[float]] = {KEPT: [], CUT: []}
        for round_number in range(args.rounds):
            # Alternated, and the first of each round alternated too.
            order = [KEPT, CUT] if round_number % 2 == 0 else [CUT, KEPT]
            for name in order:
                rates[name].append(run(server.url, f"s{round_number}-{name[8:12]}", messages_file, name == CUT))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratio = medians[KEPT] / medians[CUT]
    rows = "\n".join(f"| {name} | {medians[name]:,.0f} | {', '.join(f'{v:,.0f}' for v in rates[name])} |"
                     for name in rates)
    section = f"""## Squares

`{command(__file__)}`, {stamp()}, redis-server on loopback: {args.events:,} events of the service
bench's workload through this tree's batch pipeline (no Kafka), ideal pool, with the sums
of squares kept and with them cut out (in the bench's process only), {args.rounds} runs each,
alternated, each in a process of its own on the pure core (`STREAM_NDCG_PURE=1`), timed in its CPU time.

| pipeline | median events per CPU-second | runs |
|---|---:|---|
{rows}

- throughput with the squares / without: **{ratio:.3f}** (target: at least {TARGET}).
"""
    return publish(args.results, section, {"bench": "squares", "medians": medians, "ratio": ratio, "runs": rates,
                                           "target": TARGET, "events": args.events})


if __name__ == "__main__":
    sys.exit(main())
