"""What keeping the sums of squares costs (issue #29's target: at most 5% of throughput).

    python -m bench.squares_bench [--events 30000] [--rounds 5]

Writes the same workload (the service bench's) through this tree's batch pipeline
(`harness.pipeline.Writer`: parse, load, engine, commit, on real Redis, without Kafka) with the
squares kept and with them cut out, each run in a process of its own on a namespace of its own,
under the pool ideal (the default; under the list ideal a list's squares come with the terms it is
scored for anyway). Cut out as a build without them would be (`core_bench.cut_squares_source`),
the engine's squares step (`ListSquares`) keeps none, so no square is found, stored or exported,
and the engine does not mark a group's sums as holding them (`vocabulary.MOMENTS`), so that the
groups' sums are written in the stored layout a build without the squares writes; the service
has no such switch. Two copies of this tree's package, compiled as setup.py compiles it
(`harness.compiled_core`), one as it is and one with the cut written into its sources (a native
class's methods cannot be replaced in a process), each run in two ways:

- the compiled core, the build users run and the target's reading, each child checked to have
  loaded its copy's build;
- the pure core (`STREAM_NDCG_PURE=1`: the copies' sources), what the replay falls back to.

The four alternate round after round, the first of each round rotated. Each run is timed in its
process's CPU time (what the wait for a CPU on a shared machine does not move), as events per
CPU-second, with the cyclic collector tuned as the service tunes it
(`service.collect_garbage_for_batches`); the ratio of a pair's medians is the share of the
throughput the squares leave, against the target's 0.95.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.core_bench import PURE, PURE_CUT, cut_squares_source, run
from bench.harness.compiled_core import compiled_copy
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import workload

TARGET = 0.95
COMPILED_KEPT, COMPILED_CUT = "compiled, squares kept", "compiled, squares cut out"
PURE_KEPT = PURE
LABELS = {PURE_KEPT: "pure, squares kept"}


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    started, load_before = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="stream-ndcg-squares-bench-") as root, redis_server("squares") as server:
        packages = {COMPILED_KEPT: compiled_copy(Path(root, "kept")),
                    COMPILED_CUT: compiled_copy(Path(root, "cut"), cut_squares_source)}
        built = time.monotonic() - started
        messages_file = Path(root, "messages.jsonl")
        messages_file.write_bytes(b"\n".join(value for _, value in workload(args.events, seed=29)))
        rates: dict[str, list[float]] = {COMPILED_KEPT: [], COMPILED_CUT: [], PURE_KEPT: [], PURE_CUT: []}
        names = list(rates)
        for round_number in range(args.rounds):
            for name in names[round_number % 4:] + names[:round_number % 4]:
                namespace = f"s{round_number}-{names.index(name)}"
                cut = name in (COMPILED_CUT, PURE_CUT)
                package = packages[COMPILED_CUT if cut else COMPILED_KEPT]
                # A pure run reads its copy's sources: the cut is the compiled one's, in the source.
                variant = name if name in packages else PURE
                rates[name].append(run(server.url, namespace, messages_file, variant, package, cut_in_source=cut))
    took, load_after = time.monotonic() - started, os.getloadavg()
    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratio = medians[COMPILED_KEPT] / medians[COMPILED_CUT]
    pure_ratio = medians[PURE_KEPT] / medians[PURE_CUT]
    rows = "\n".join(f"| {LABELS.get(name, name)} | {medians[name]:,.0f} | "
                     f"{', '.join(f'{v:,.0f}' for v in rates[name])} |" for name in rates)
    section = f"""## Squares

`{command(__file__)}`, {stamp()}, redis-server on loopback: {args.events:,} events of the service
bench's workload through this tree's batch pipeline (no Kafka), ideal pool, with the sums of
squares kept and with them cut out as a build without them would be (`core_bench.cut_squares_source`:
the engine's squares step and its moments mark), on the compiled core (two copies of the package
compiled as setup.py does, one with the cut in its source) and on the pure one (the same copies'
sources, `STREAM_NDCG_PURE=1`), {args.rounds} runs each, alternated, each in a process of its own, timed
in its CPU time, the collector tuned as the service tunes it. Load average (1 min)
{load_before[0]:.1f} before, {load_after[0]:.1f} after; {took / 60:.1f} minutes in all, {built:.0f} s of it
compiling the two copies.

| pipeline | median events per CPU-second | runs |
|---|---:|---|
{rows}

- compiled core, throughput with the squares / without: **{ratio:.3f}** (target: at least
  {TARGET}); the target's reading, the build users run.
- pure core, the same: **{pure_ratio:.3f}**.
"""
    return publish(args.results, section, {"bench": "squares", "medians": medians, "ratio": ratio,
                                           "pure_ratio": pure_ratio, "runs": rates, "target": TARGET,
                                           "events": args.events, "seconds": took, "build_seconds": built,
                                           "load_average": [load_before[0], load_after[0]]})


if __name__ == "__main__":
    sys.exit(main())
