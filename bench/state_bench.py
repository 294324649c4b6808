"""Where the stored state's Redis bytes go: each kind of key of the two workloads that issue #30's
memory targets are measured on, taken apart.

    python -m bench.state_bench [--held 1000000] [--queries 100000] [--quick]

The service's batch pipeline (`harness.pipeline.Writer`: parse, load, engine, commit to a real
local redis-server, event clock) takes in, one after the other on one server:

1. the service bench's memory workload (`service_bench`: Zipf queries, few judgments) with
   about --held impressions held, with the default settings;
2. the drill-down bench's sparse workload (`api_bench`: two hours of --queries distinct queries,
   drill-down rows kept), with its settings.

For each kind of key (the key's name after its hash tag): how many keys, their MEMORY USAGE per
impression held, the fields (of a hash) or members (of a sorted set) per key, the mean length of
a hash's field names and values, the share of fields too long for a listpack (longer than the
server's `hash-max-listpack-value`, 64 by default: one of them makes its whole hash a hashtable),
and the encodings (OBJECT ENCODING) with their keys. Rewrites the "Stored state" section of
bench/RESULTS.md.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import redis

from bench.api_bench import HOUR_MS, START_MS, events, settings_of
from bench.harness.figures import KindAnatomy, anatomy
from bench.harness.pipeline import Writer
from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import workload
from stream_ndcg.config import Settings
from stream_ndcg.service import collect_garbage_for_batches


def figures(kinds: dict[str, KindAnatomy], impressions: int) -> dict[str, Any]:
    by_kind = {}
    for name, kind in sorted(kinds.items(), key=lambda item: -item[1].used):
        fields = max(kind.fields, 1)
        by_kind[name] = {"keys": kind.keys, "bytes_per_impression": round(kind.used / impressions, 1),
                         "bytes_per_key": round(kind.used / kind.keys),
                         "fields_per_key": round(kind.fields / kind.keys, 1),
                         "field_bytes": round(kind.field_bytes / fields, 1),
                         "value_bytes": round(kind.value_bytes / fields, 1),
                         "over_listpack_value": round(kind.over_listpack_value / fields, 3),
                         "encodings": dict(kind.encodings.most_common())}
    return {"impressions": impressions,
            "bytes_per_impression": round(sum(kind.used for kind in kinds.values()) / impressions, 1),
            "by_kind": by_kind}


def table(title: str, measured: dict[str, Any]) -> list[str]:
    rows = [f"### {title}: {measured['bytes_per_impression']} bytes per impression held "
            f"({measured['impressions']:,} impressions)", "",
            "| kind | keys | bytes per impression | bytes per key | fields per key | field name, bytes | "
            "value, bytes | fields over the listpack limit | encodings |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, kind in measured["by_kind"].items():
        encodings = ", ".join(f"{encoding} {keys}" for encoding, keys in kind["encodings"].items())
        rows.append(f"| {name} | {kind['keys']} | {kind['bytes_per_impression']} | {kind['bytes_per_key']} | "
                    f"{kind['fields_per_key']} | {kind['field_bytes']} | {kind['value_bytes']} | "
                    f"{kind['over_listpack_value']:.1%} | {encodings} |")
    return [*rows, ""]


def main() -> int:
    parser = argument_parser(__doc__, quick=True)
    parser.add_argument("--held", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=100_000)
    args = parser.parse_args()
    if args.quick:
        args.held, args.queries = 20_000, 5_000
    # The writer below is the service's batch pipeline, and the service runs it with this collector.
    collect_garbage_for_batches()
    result: dict[str, Any] = {"bench": "state"}
    with redis_server("state") as server:
        client = redis.Redis.from_url(server.url)
        # As the service bench's memory phase: few judgments, about `held` impressions.
        stream = [value for _, value in workload(int(args.held * 1.2), seed=7, judged_share=0.03)]
        Writer(Settings.load(flags={"redis_url": server.url, "namespace": "svc", "clock": "event"})).write_all(stream)
        result["service"] = figures(anatomy(client, "svc"), sum(1 for m in stream if b'"impression"' in m))
        print(json.dumps(result["service"]), file=sys.stderr)
        client.flushall()
        # As the drill-down bench's memory phase: two hours, every query in each.
        sparse = [*events(args.queries, seed=3, start_ms=START_MS - HOUR_MS, span_ms=HOUR_MS),
                  *events(args.queries, seed=4, start_ms=START_MS, span_ms=HOUR_MS - 60_000)]
        Writer(settings_of(server.url, "api")).write_all(sparse)
        result["sparse"] = figures(anatomy(client, "api"), sum(1 for m in sparse if b'"impression"' in m))
        print(json.dumps(result["sparse"]), file=sys.stderr)
        client.close()
    section = "\n".join([
        "## Stored state", "",
        f"- date: {stamp()}; command: `{command(__file__)}`; the service's batch pipeline in process "
        "into one local redis-server (default listpack limits), the event clock.",
        "- MEMORY USAGE per key, summed by kind; the targets (issue #30) are at most 150 bytes per impression "
        "on the service workload and 300 on the sparse one.", "",
        *table(f"Service workload ({args.held:,} impressions asked for)", result["service"]),
        *table(f"Sparse workload ({args.queries:,} distinct queries, drill-down rows)", result["sparse"])])
    return publish(args.results, section, result)


if __name__ == "__main__":
    sys.exit(main())
