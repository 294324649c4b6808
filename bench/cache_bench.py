"""What the state cache's bound costs over a long catch-up: the batch pipeline's CPU per event,
slice by slice, with the default cache and with one large enough to hold every state.

    python -m bench.cache_bench [--events 300000] [--slice 50000] [--large-mib 4096]

Writes the service bench's workload through this tree's batch pipeline (`harness.pipeline.Writer`:
parse, load, engine, commit, on real Redis, without Kafka), once with the default
`state_cache_mib` and `state_cache_groups` and once with caches no state of the run outgrows, each
in a process of its own, one after the other. Per slice of the events it records the process's CPU
time per event and what the cache did in the slice (hits, misses, evictions: `StateCache.figures`).
The workload's head queries show a new ranked list at almost every impression, so their states
grow all through the run; a state the cache does not hold is read back from Redis and decoded
whole, so once the head queries' states outgrow the cache the CPU per event grows with them. The
large cache's run is the baseline: the same events, the same process, each state read at most once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import workload

ROOT = Path(__file__).resolve().parents[1]
DEFAULT, LARGE = "default cache", "large cache"


def child(url: str, namespace: str, messages_file: Path, slice_events: int, cache_mib: str, cache_groups: str) -> None:
    """One run: the messages slice by slice; prints a JSON line per slice."""
    from bench.harness.pipeline import Writer
    from stream_ndcg.config import Settings

    environ = {"STREAM_NDCG_REDIS_URL": url, "STREAM_NDCG_NAMESPACE": namespace, "STREAM_NDCG_CLOCK": "event",
               "STREAM_NDCG_IDEAL": "pool"}
    if cache_mib:
        environ |= {"STREAM_NDCG_STATE_CACHE_MIB": cache_mib, "STREAM_NDCG_STATE_CACHE_GROUPS": cache_groups}
    writer = Writer(Settings.load(environ=environ))
    messages = messages_file.read_bytes().splitlines()
    before = writer.store.cache_figures()
    for start in range(0, len(messages), slice_events):
        part = messages[start:start + slice_events]
        started = time.process_time()
        writer.write_all(part)
        spent = time.process_time() - started
        after = writer.store.cache_figures()
        lookups = after.hits + after.misses - before.hits - before.misses
        print(json.dumps({"from": start, "events": len(part), "cpu_us_per_event": spent / len(part) * 1e6,
                          "hit_ratio": (after.hits - before.hits) / lookups if lookups else None,
                          "evictions": after.evictions - before.evictions,
                          "cached_mib": after.estimated_bytes / 2**20, "cached_states": after.states}), flush=True)
        before = after


def run(url: str, namespace: str, messages_file: Path, slice_events: int, cache_mib: str) -> list[dict[str, float]]:
    out = subprocess.run([sys.executable, "-P", "-m", "bench.cache_bench", "--child", url, namespace,
                          str(messages_file), str(slice_events), cache_mib, str(10**9)],
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, check=True,
                         cwd=ROOT)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7])
        return 0
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--slice", type=int, default=50_000)
    parser.add_argument("--large-mib", type=int, default=4096)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stream-ndcg-cache-bench-") as root, redis_server("cache") as server:
        messages_file = Path(root, "messages.jsonl")
        messages_file.write_bytes(b"\n".join(value for _, value in workload(args.events, seed=1)))
        slices = {DEFAULT: run(server.url, "default", messages_file, args.slice, ""),
                  LARGE: run(server.url, "large", messages_file, args.slice, str(args.large_mib))}
    rows = []
    for default, large in zip(slices[DEFAULT], slices[LARGE], strict=True):
        rows.append(f"| {default['from']:,}-{default['from'] + default['events']:,} "
                    f"| {default['cpu_us_per_event']:.1f} | {_share(default['hit_ratio'])} | {default['evictions']:,} "
                    f"| {default['cached_mib']:.0f} | {large['cpu_us_per_event']:.1f} | {_share(large['hit_ratio'])} "
                    f"| {large['cached_mib']:.0f} | {default['cpu_us_per_event'] / large['cpu_us_per_event']:.2f} |")
    last = (slices[DEFAULT][-1]["cpu_us_per_event"], slices[LARGE][-1]["cpu_us_per_event"])
    section = f"""## Catch-up size

`{command(__file__)}`, {stamp()}, redis-server on loopback: {args.events:,} events of the service
bench's workload (seed 1) through this tree's batch pipeline (no Kafka), ideal pool, in slices of
{args.slice:,}: once with the default state cache (`state_cache_mib` 128, `state_cache_groups`
20,000), once with a cache of {args.large_mib:,} MiB that holds every state of the run, each in a
process of its own, timed in its CPU time. Hit ratio: the share of the states a batch asked for
that the cache held; MiB: the cache's estimated size at the end of the slice.

| events | default: µs/event | hit ratio | evictions | MiB | large: µs/event | hit ratio | MiB | default / large |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

- last slice, default cache / large cache: **{last[0] / last[1]:.2f}** ({last[0]:.1f} against {last[1]:.1f} µs per
  event).
"""
    return publish(args.results, section, {"bench": "cache", "events": args.events, "slice": args.slice,
                                           "slices": slices, "last_ratio": last[0] / last[1]})


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
