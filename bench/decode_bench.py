"""What reading a query's state back from Redis costs: the decode of its compact hash.

    python -m bench.decode_bench [--events 100000] [--rounds 5]

Writes the service bench's workload (seed 1, pool ideal) through this tree's batch pipeline
(`harness.pipeline.Writer`: parse, load, engine, commit, on real Redis, without Kafka), then, in a
child process per core (the compiled one this tree built, and the pure one, `STREAM_NDCG_PURE=1`),
reads every query's compact hash (``{ns:P}:g:<query>``, `state.redis_scripts`) with HGETALL and
decodes each into a fresh `QueryState`, as the store does with a state its cache does not hold.

Two decoders, round after round in the same process, the first of each round alternated: this
tree's `compact_format.groups_from_fields`, and the decode as it was before this bench's change
(`decode_before`, kept here as the baseline: every field's name and value decoded to text, the
tables interned a document at a time, each list decoded a character at a time (`positions_of`,
kept here too) and its ranks built by an interpreted loop over `first_occurrences`; the helpers
it shares with this tree, `credited_of`, `table_of`, `Interned`, are those it had). Before any
timing, both decodes of every hash are checked to give the same groups, lists and ranks, in the
same order. The HGETALL of the same hashes (one pipeline; the client's CPU, not the server's) is
timed in the same rounds as a reference of what the read costs apart from the decode. Everything
is timed in the child's CPU time, with the service's garbage collector settings
(`collect_garbage_for_batches`); the figures are the medians over the rounds.

The hashes are also split by size (their fields): the 10 largest, the next 90, and the rest, each
timed on its own, to show how much of the decode the head queries' states take.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import workload
from stream_ndcg.core_build import core_build
from stream_ndcg.metric import first_occurrences
from stream_ndcg.query_state import Group, QueryState
from stream_ndcg.service import collect_garbage_for_batches
from stream_ndcg.state.compact_format import _TABLES, Interned, credited_of, groups_from_fields, table_of
from stream_ndcg.stored_lists import DIGITS

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "decode"
BEFORE, AFTER, READ = "before", "after", "hgetall"
# The tiers of hashes by size: (name, first, end) in the hashes sorted by their fields, largest first.
TIERS = (("10 largest", 0, 10), ("next 90", 10, 100), ("the rest", 100, None))

Hash = dict[bytes, bytes]
_DIGIT = {digit: i for i, digit in enumerate(DIGITS)}


def positions_of(text: str) -> list[int]:
    """A stored list's indices read a character at a time, as the decode before the change read them."""
    indices: list[int] = []
    i = 0
    while i < len(text):
        if text[i] == "!":
            end = text.index("!", i + 1)
            indices.append(int(text[i + 1:end]))
            i = end + 1
        else:
            indices.append(_DIGIT[text[i]])
            i += 1
    return indices


def decode_before(state: QueryState, fields: Hash) -> None:
    """`compact_format.groups_from_fields` before this bench's change: the baseline."""
    values: dict[str, list[tuple[int, str]]] = {}
    lists: list[tuple[str, str, int]] = []
    for raw_name, raw_value in fields.items():
        name, value = raw_name.decode(), raw_value.decode()
        base, colon, listed = name.partition(":")
        if colon:
            lists.append((base, listed, int(value)))
            continue
        base, _, piece = name.partition("~")
        values.setdefault(base, []).append((int(piece) if piece else 0, value))
    interned = Interned()
    joined = {name: "".join(text for _, text in sorted(parts)) for name, parts in values.items()}
    interned.piece_counts = {name: len(parts) for name, parts in values.items()}
    for doc in table_of(joined.pop("d", "")):
        interned.doc(doc)
    for segment in table_of(joined.pop("s", "")):
        interned.segment(segment)
    keys: dict[str, tuple[int, str]] = {}
    for name, text in joined.items():
        bucket, _, segment_index = name.partition(".")
        key = keys[name] = (int(bucket), interned.segments[int(segment_index)])
        impressions, credited = credited_of(text)
        state.groups[key] = Group(impressions=impressions, credited=credited)
    docs = interned.docs
    for name, listed, count in lists:
        group = state.groups[keys[name]]
        ranked = tuple(docs[i] for i in positions_of(listed))
        group.lists[ranked] = count
        for rank, doc in first_occurrences(ranked, len(ranked)):
            at = group.ranks.setdefault(doc, {})
            at[rank] = at.get(rank, 0) + count
    for key in keys.values():
        interned.stored[key] = state.groups[key]
    _TABLES.put(state, interned)


def described(state: QueryState) -> list[Any]:
    """A state's groups as comparable values, every dict's order included (a group's ranks are
    walked in their order by the exposure figures and by the next write's interning)."""
    return [(key, group.impressions, list(group.credited.items()), list(group.lists.items()),
             [(doc, list(at.items())) for doc, at in group.ranks.items()], group.ranks_changes,
             group._listed, group._shown_at) for key, group in state.groups.items()]


def child(url: str, rounds: int) -> None:
    """Reads and decodes every compact hash `rounds` times; prints one JSON line of the figures."""
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{{{NAMESPACE}:*}}:g:*", count=1000))

    def read() -> list[dict[bytes, bytes]]:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        return list(pipe.execute())

    hashes = sorted(read(), key=len, reverse=True)
    for fields in hashes:
        before, after = QueryState(), QueryState()
        decode_before(before, fields)
        groups_from_fields(after, fields)
        if described(before) != described(after):
            raise SystemExit(f"the two decodes differ on a hash of {len(fields)} fields")
    decoders: dict[str, Callable[[QueryState, Hash], None]] = {BEFORE: decode_before, AFTER: groups_from_fields}
    spent: dict[str, list[float]] = {name: [] for name in [READ, *(f"{decoder}:{tier}" for decoder in decoders
                                                                    for tier, *_ in TIERS)]}
    gc.collect()
    collect_garbage_for_batches()
    for round_ in range(rounds):
        started = time.process_time()
        read()
        spent[READ].append(time.process_time() - started)
        for name in (BEFORE, AFTER) if round_ % 2 == 0 else (AFTER, BEFORE):
            decode = decoders[name]
            for tier, first, end in TIERS:
                held = []
                started = time.process_time()
                for fields in hashes[first:end]:
                    state = QueryState()
                    decode(state, fields)
                    held.append(state)
                spent[f"{name}:{tier}"].append(time.process_time() - started)
                del held
                gc.collect()
    sizes = {tier: {"hashes": len(hashes[first:end]), "fields": sum(map(len, hashes[first:end])),
                    "lists": sum(1 for fields in hashes[first:end] for name in fields if b":" in name)}
             for tier, first, end in TIERS}
    print(json.dumps({"core": core_build().describe(), "sizes": sizes,
                      "seconds": {name: statistics.median(values) for name, values in spent.items()}}), flush=True)


def run(url: str, rounds: int, pure: bool) -> dict[str, Any]:
    env = {key: value for key, value in os.environ.items() if key != "STREAM_NDCG_PURE"}
    env["PYTHONPATH"] = str(ROOT)
    if pure:
        env["STREAM_NDCG_PURE"] = "1"
    out = subprocess.run([sys.executable, "-P", "-m", "bench.decode_bench", "--child", url, str(rounds)],
                         env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def write(url: str, events: int) -> None:
    from bench.harness.pipeline import Writer
    from stream_ndcg.config import Settings

    writer = Writer(Settings.load(environ={"STREAM_NDCG_REDIS_URL": url, "STREAM_NDCG_NAMESPACE": NAMESPACE,
                                           "STREAM_NDCG_CLOCK": "event", "STREAM_NDCG_IDEAL": "pool"}))
    writer.write_all([value for _, value in workload(events, seed=1)])


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return 0
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with redis_server("decode") as server:
        write(server.url, args.events)
        cores = [run(server.url, args.rounds, pure) for pure in (False, True)]
    totals, tiers = [], []
    for core in cores:
        seconds = core["seconds"]
        before = sum(seconds[f"{BEFORE}:{tier}"] for tier, *_ in TIERS)
        after = sum(seconds[f"{AFTER}:{tier}"] for tier, *_ in TIERS)
        core["before_s"], core["after_s"], core["ratio"] = before, after, after / before
        totals.append(f"| {core['core']} | {1e3 * seconds[READ]:.0f} | {1e3 * before:.0f} | {1e3 * after:.0f} "
                      f"| **{after / before:.3f}** | {before / seconds[READ]:.2f} | {after / seconds[READ]:.2f} |")
        lists = sum(size["lists"] for size in core["sizes"].values())
        for tier, *_ in TIERS:
            size, tier_before, tier_after = core["sizes"][tier], seconds[f"{BEFORE}:{tier}"], seconds[f"{AFTER}:{tier}"]
            tiers.append(f"| {core['core']} | {tier} | {size['hashes']:,} | {size['fields']:,} "
                         f"| {size['lists'] / lists:.3f} | {1e3 * tier_before:.0f} | {tier_before / before:.3f} "
                         f"| {1e3 * tier_after:.0f} | {tier_after / after:.3f} | {tier_after / tier_before:.3f} |")
    section = f"""## State decode

`{command(__file__)}`, {stamp()}, redis-server on loopback: {args.events:,} events of the service
bench's workload (seed 1, ideal pool) written through this tree's batch pipeline (no Kafka), then
every query's compact hash read back (HGETALL) and decoded into a fresh state, in a child process
per core, {args.rounds} rounds, medians of the child's CPU time. Before: the decode as it was
before the change, kept in the bench as the baseline; after: this tree's `groups_from_fields`;
both checked to give the same groups, lists and ranks, in the same order, for every hash.
HGETALL: the client's CPU for reading the same hashes (one pipeline), for scale.

| core | HGETALL ms | before: decode ms | after: decode ms | after / before | before / HGETALL | after / HGETALL |
|---|---:|---:|---:|---:|---:|---:|
{chr(10).join(totals)}

By the hashes' size (their fields, largest first): their share of all the ranked lists, and of
each decode's time.

| core | hashes | count | fields | share of lists | before ms | share | after ms | share | after / before |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(tiers)}
"""
    return publish(args.results, section, {"bench": "decode", "events": args.events, "rounds": args.rounds,
                                           "cores": cores})


if __name__ == "__main__":
    sys.exit(main())
