"""Replay throughput, next to pytrec_eval (trec_eval) scoring the same impressions in the same run.

    python -m bench.replay_bench [--events 300000] [--results bench/RESULTS.md]

Prints one JSON line last; rewrites the replay section of RESULTS.md.
"""

from __future__ import annotations

import gc
import platform
import statistics
import sys
import time

import pytrec_eval

from bench.harness.results import argument_parser, command, publish, stamp
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.events import Impression, InvalidEvent, parse_event
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay

CUTOFFS = (5, 10)
# The cost issue's target: the replay within 5x of pytrec_eval's time.
TARGET_RATIO = 5.0


def timed_replay(messages: list[bytes]) -> float:
    started = time.perf_counter()
    replay = Replay(Measure(cutoffs=CUTOFFS, gain="linear"))
    for message in messages:
        replay.add(message)
    replay.summary()
    return time.perf_counter() - started


def trec_inputs(messages: list[bytes]) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    replay = Replay(Measure(cutoffs=CUTOFFS, gain="linear"))
    impressions: list[Impression] = []
    for message in messages:
        replay.add(message)
        event = parse_event(message)
        if isinstance(event, Impression) and not isinstance(event, InvalidEvent):
            impressions.append(event)
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    grades_by_query: dict[str, dict[str, int]] = {}
    for imp in impressions:
        grades = grades_by_query.get(imp.query_id)
        if grades is None:
            grades = grades_by_query[imp.query_id] = {d: int(g) for d, g in replay.grades(imp.query_id).items()}
        if grades:
            qrels[imp.impression_id] = grades
            run[imp.impression_id] = {doc: float(len(imp.results) - r) for r, doc in enumerate(imp.results)}
    return qrels, run


def timed_trec(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> float:
    started = time.perf_counter()
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.5,10"})
    evaluator.evaluate(run)
    return time.perf_counter() - started


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = SimulationSpec(events=args.events, seed=99, queries=5_000, rate=500.0, max_delay_ms=600_000)
    messages = [value for _, value in Simulator(spec).messages()]
    qrels, run = trec_inputs(messages)
    # The harness's own inputs (every message in one list, trec_eval's dicts) are put out of the
    # garbage collector's sight: otherwise each full collection the replay's allocations trigger
    # walks them, a cost `stream-ndcg replay`, which reads its lines one at a time, never pays.
    gc.collect()
    gc.freeze()
    replay_times, trec_times = [], []
    for _ in range(args.rounds):
        replay_times.append(timed_replay(messages))
        trec_times.append(timed_trec(qrels, run))
    replay_s, trec_s = statistics.median(replay_times), statistics.median(trec_times)
    result = {
        "bench": "replay",
        "events": len(messages),
        "impressions_scored_by_trec_eval": len(run),
        "replay_events_per_s": round(len(messages) / replay_s),
        "pytrec_eval_impressions_per_s": round(len(run) / trec_s),
        "replay_seconds": round(replay_s, 3),
        "pytrec_eval_seconds": round(trec_s, 3),
        "replay_time_over_pytrec_eval_time": round(replay_s / trec_s, 2),
        "target": f"<= {TARGET_RATIO:g}",
    }
    section = "\n".join([
        "## Replay throughput",
        "",
        f"- date: {stamp()}; machine: {platform.machine()}, "
        f"{platform.python_implementation()} {platform.python_version()}, 2 cores (shared)",
        f"- command: `{command(__file__)}` (median of {args.rounds} rounds, both measured in the same run)",
        "- replay: parse every JSON line under the contract, keep revisions, score every impression at k=5,10 "
        "(linear gain, pool ideal), summarise",
        "- pytrec_eval: only `RelevanceEvaluator(qrels, {'ndcg_cut.5,10'}).evaluate(run)` on prebuilt dicts of the "
        "same impressions (no JSON, no contract): a lower bound on any trec_eval pipeline",
        "- the harness's inputs are frozen out of the garbage collector (`gc.freeze()`) before either is timed",
        "",
        "| events | impressions | replay events/s | pytrec_eval impressions/s | replay s | pytrec_eval s | ratio "
        "| target |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {result['events']} | {result['impressions_scored_by_trec_eval']} | {result['replay_events_per_s']} | "
        f"{result['pytrec_eval_impressions_per_s']} | {result['replay_seconds']} | {result['pytrec_eval_seconds']} | "
        f"{result['replay_time_over_pytrec_eval_time']} | {result['target']} |",
        "",
        "ratio = replay time / pytrec_eval time for the same impressions (lower is better).",
        "",
    ])
    return publish(args.results, section, result)


if __name__ == "__main__":
    sys.exit(main())
