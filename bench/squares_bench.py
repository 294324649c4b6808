"""What keeping the sums of squares costs (issue #29's target: at most 5% of throughput).

    python -m bench.squares_bench [--events 30000] [--rounds 5]

Writes the same workload (the service bench's) through this tree's batch pipeline
(`harness.pipeline.Writer`: parse, load, engine, commit, on real Redis, without Kafka) with the
squares kept and with them cut out, each run in a process of its own on a namespace of its own, the
two alternated round after round, under the pool ideal (the default; under the list ideal a list's
squares come with the terms it is scored for anyway). Cut out is done in the bench's child alone
(`core_bench.cut_squares`): the engine's squares step (`ListSquares`) is swapped for one that
keeps none, so no square is found, stored or exported; the service has no such switch. Both run the pure core
(`STREAM_NDCG_PURE=1`): the cut patches `ListSquares`, which the compiled core's native class
refuses (bench/core_bench.py sets the compiled pipeline against these). Each run is timed in its process's
CPU time (what the wait for a CPU on a shared machine does not move), as events per CPU-second;
the ratio of the medians is the share of the throughput the squares leave, against the target's
0.95.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from bench.core_bench import PURE, PURE_CUT, run
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import workload

TARGET = 0.95
KEPT, CUT = "squares kept", "squares cut out"


def main() -> int:
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
                rates[name].append(run(server.url, f"s{round_number}-{name[8:12]}", messages_file,
                                       PURE_CUT if name == CUT else PURE))
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
