"""The stored form of the state: query states, groups, ranked lists and aggregate sums as hash fields.

Both stores keep a query state in this form: Redis as the fields of the query's
hash, the in-memory store as the same mapping in a dict. The engine's objects
(`QueryState`, `Group`) never see it, and nothing in the pure core imports this
module.

A query state is one hash:

    r|<doc>                JSON list of the document's judgment events [ts, event_id, grade],
                           [ts, event_id, grade, source] for a source other than raters (format
                           4; formats 1 to 3 hold raters' events only); a commit appends the
                           batch's events to it (`revisions_tail`), or writes it whole when old
                           ones were forgotten
    g|<bucket>|<segment>   JSON group [impressions, credited, ranks, lists]:
                           credited  [[cut-offs], impressions, moments, then per cut-off its dcg,
                                     judged, ndcg, scored, dcg_sq and ndcg_sq sums] (format 5;
                                     without moments and the squares as formats 1 to 4 wrote
                                     it), or {field: sum} for any other set
                           ranks     flat: each document, then its first ranks, `rank` where one
                                     impression shows it there, `[rank, impressions]` where more do
                           lists     [[list, impressions]] (for the list ideal only: under the pool
                                     ideal a group's lists are those of its bucket's lists hash)
                           e.g. [2,[[5,10],2,1.5,0.2,...],["d3",1,4,"d14",[2,2]],[]]. Formats 1
                           and 2 wrote {"n": impressions, "c": {field: sum}, "r": {doc: {first
                           rank: impressions}}, "l": lists}, read as they are.

Beside it, a query's ranked lists of one bucket are a hash of
``<segment>\x1f<positions>`` -> impressions, where the positions are the list's
documents as indices, comma-separated, into its group's ranked documents in
their order (the order documents were first shown in the group, which never
changes while the group lives). A list costs a few bytes a document instead of
its ids, short enough for Redis to keep a small hash as a listpack. Format 1
wrote JSON ``[segment, list]`` fields: they are still read, and a hash may hold
both forms of one list (their impressions add up). The aggregate sums of one bucket a hash
of ``<segment>|<field>`` -> sum (field names from `vocabulary`), and the
drill-down rows of one bucket a hash of ``<segment>\x1f<query>`` -> the row's
values, comma-separated in `rows.row_fields` order, whole numbers without
'.0' since format 3 (a row holds the sums
of one group; rows arrived with format version 1 and are optional: state
written before them has none, and the drill-down sees its groups once they
are re-credited).

`FORMAT_VERSION` numbers this layout. A store records it with the state and refuses state
recorded with a version it cannot read (`check_format`): this one reads 1 (JSON list fields; state
recorded before the number existed is version 1), 2 (lists as positions), 3 (groups by position),
4 (judgment events with their source), 5 (sums of squares), 6 (experiments' cells), 7 (groups in a
compact hash) and 8 (rows and impression ids in sharded hashes), and records the one it writes: 8,
or 7 (or 6) when `state_format` says so (`check_written_format`). Releases that read only 1 to 5
refuse 6: they would commit without the experiments' changes; those that read up to 7 refuse 8. A
group of formats 1 to 4 has no squares: the engine adds them when it re-credits the group (the
store gives a group of the pool ideal its lists from the bucket's on load, `RedisStore.load`), and
until then the `moments` sum counts its impressions out. State of format 5 needs nothing
converted: an experiment's cells start empty, and each partition counts from the bucket after its
clock at its first commit with the experiment (`state.base`), so no group of the old state is
counted in part.

An experiment's cells (format 6) of one partition are a hash: `state.experiment_format`. Since
format 7 a query's groups are a hash of their own (`state.compact_format`), where one of an earlier
format moves when it changes; since format 8 the drill-down rows and the impression ids are hashes
sharded by a hash of the query or the id (`state.shard_format`), where a row moves when written.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import orjson

from stream_ndcg.engine import BatchOutcome, QueryChange
from stream_ndcg.errors import ConfigError
from stream_ndcg.query_state import Group, QueryState, Revision
from stream_ndcg.rows import Row
from stream_ndcg.vocabulary import (
    IMPRESSIONS,
    MOMENTS,
    RATERS,
    dcg_at,
    dcg_squares_at,
    judged_at,
    ndcg_at,
    ndcg_squares_at,
    scored_at,
)

# Bump it with any change to the layout above, and teach the stores to read the old one or to refuse it.
FORMAT_VERSION = 8
# What this release reads; it records the one it writes (`state_format`) over any of them. Each
# added: 1 the first layout; 2 lists as positions; 3 groups by position; 4 judgment events with their
# source; 5 sums of squares; 6 experiments' cells; 7 compact groups; 8 sharded rows and impression ids.
READABLE_FORMATS = ("1", "2", "3", "4", "5", "6", "7", "8")


def check_format(found: str | None) -> None:
    """Refuse state recorded in a format this release cannot read; None (nothing recorded) is
    state written before the version was recorded, which is version 1."""
    if found is not None and found not in READABLE_FORMATS:
        readable = f"{', '.join(READABLE_FORMATS[:-1])} and {READABLE_FORMATS[-1]}"
        raise ConfigError(f"the stored state is in format version {found!r}, and this release reads versions "
                          f"{readable} only: run a release that reads it, or use another namespace")


def check_written_format(found: str | None, written: int) -> None:
    """Refuse to write state in a format older than the one recorded: the previous release, which
    the older format is for, would not read what the newer one already wrote."""
    if found is not None and int(found) > written:
        raise ConfigError(f"the stored state is in format version {found}, and this instance is set to write "
                          f"version {written} (state_format): once the state is written in a format, an instance "
                          f"cannot go back to an earlier one; set state_format to {found}, or use another namespace")


def revisions_field(doc: str) -> str:
    return f"r|{doc}"


def group_field(bucket: int, segment: str) -> str:
    return f"g|{bucket}|{segment}"


def encode_group(group: Group) -> str:
    layout = credited_layout(tuple(group.credited))
    if layout is None:
        credited = orjson.dumps(group.credited)
    else:
        cutoffs, names = layout
        credited = whole_numbers_short(orjson.dumps([cutoffs, *[group.credited[name] for name in names]]))
    # The ranks and the lists change together (`Group.add_list`).
    encoded_ranks = _ENCODED_RANKS.get(group)
    if encoded_ranks is None:
        ranks: list[object] = []
        append = ranks.append
        for doc, at in group.ranks.items():
            append(doc)
            for rank, count in at.items():
                append(rank if count == 1 else [rank, count])
        lists = _encoded_lists(group.lists) if group.lists_stored else "[]"
        encoded_ranks = _ENCODED_RANKS.put(group, f"{_kept(ranks)},{lists}")
    return f"[{group.impressions},{credited.decode()},{encoded_ranks}]"


def _encoded_lists(lists: Mapping[tuple[str, ...], int]) -> str:
    return _kept([[list(ranked), count] for ranked, count in lists.items()])


def decode_group(raw: bytes | str) -> Group:
    data = orjson.loads(raw)
    if isinstance(data, dict):
        return _decode_named_group(data)
    impressions, stored_credited, stored_ranks, stored_lists = data
    if isinstance(stored_credited, list):
        cutoffs = tuple(stored_credited[0])
        # Formats 1 to 4 stored 1 + 4 figures per cut-off, format 5 2 + 6: never as many.
        names = sums_in_stored_order(cutoffs, len(stored_credited) - 1 != 1 + 4 * len(cutoffs))
        credited = dict(zip(names, map(float, stored_credited[1:]), strict=True))
    else:
        credited = stored_credited
    ranks: dict[str, dict[int, int]] = {}
    at: dict[int, int] = {}
    for item in stored_ranks:
        if type(item) is str:
            at = ranks[item] = {}
        elif type(item) is int:
            at[item] = 1
        else:
            at[item[0]] = item[1]
    lists = {tuple(ranked): count for ranked, count in stored_lists}
    # A group with impressions and no list stored is one of the pool ideal: the store gives it its
    # lists from the bucket's (`complete_lists`).
    group = Group(impressions=impressions, credited=credited, ranks=ranks, lists=lists,
                  lists_stored=bool(lists) or not impressions)
    # Kept encoded for the group's next write (a judgment rewrites it with these ranks, most often).
    _ENCODED_RANKS.put(group, f"{_kept(stored_ranks)},{_encoded_lists(lists)}")
    return group


class _RankEncodings:
    """The stored form of each live group's ranks, until they change: under the pool ideal a
    judgment rewrites every group of its query, most of them with the ranks they had. Keyed by the
    group's identity and held by a weak reference, so an entry goes with its group and can never
    answer for another; valid while the group's `ranks_changes` is the one it was made at."""

    def __init__(self) -> None:
        # No lock: the writer and the drill-down's reader both get and put, and each operation
        # on the dict is atomic; a race costs at most a miss, never a wrong answer.
        self._held: dict[int, tuple[weakref.ref[Group], int, str]] = {}

    def get(self, group: Group) -> str | None:
        held = self._held.get(id(group))
        if held is None or held[0]() is not group or held[1] != group.ranks_changes:
            return None
        return held[2]

    def put(self, group: Group, encoded: str) -> str:
        key = id(group)
        self._held[key] = (weakref.ref(group, lambda _: self._forget(key)), group.ranks_changes, encoded)
        return encoded

    def _forget(self, key: int) -> None:
        held = self._held.get(key)
        # The key may already name a newer group that reused the identity.
        if held is not None and held[0]() is None:
            self._held.pop(key, None)


_ENCODED_RANKS = _RankEncodings()


def _kept(value: object) -> str:
    """JSON to keep: a str copy, since the bytes orjson returns hold about 4 KB whatever their length."""
    return orjson.dumps(value).decode()


def _decode_named_group(data: dict[str, Any]) -> Group:
    """A group of formats 1 and 2."""
    return Group(
        impressions=data["n"],
        credited=data["c"],
        # JSON object keys are strings: the ranks come back as text.
        ranks={doc: {int(rank): count for rank, count in at.items()} for doc, at in data["r"].items()},
        lists={tuple(ranked): count for ranked, count in data["l"]},
    )


@functools.cache
def sums_in_stored_order(cutoffs: tuple[int, ...], squares: bool) -> tuple[str, ...]:
    """The stored order of a group's credited figures when they are those of `cutoffs`, with the
    sums of squares (format 5) or without (a group whose squares are unknown, and formats 1 to 4)."""
    if not squares:
        return (IMPRESSIONS, *(name(k) for k in cutoffs for name in (dcg_at, judged_at, ndcg_at, scored_at)))
    return (IMPRESSIONS, MOMENTS, *(name(k) for k in cutoffs for name in (
        dcg_at, judged_at, ndcg_at, scored_at, dcg_squares_at, ndcg_squares_at)))


@functools.cache
def credited_layout(names: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """The cut-offs whose figures `names` are, all of them and nothing else, with those figures in
    the stored order; None for any other set of names (stored by name)."""
    try:
        cutoffs = tuple(int(name.removeprefix("dcg@")) for name in names if name.startswith("dcg@"))
    except ValueError:
        return None
    ordered = sums_in_stored_order(cutoffs, MOMENTS in names)
    return (cutoffs, ordered) if sorted(ordered) == sorted(names) else None


def whole_numbers_short(encoded: bytes) -> bytes:
    """A JSON array of numbers written by orjson, with '2' for '2.0': it writes a whole double below
    1e16 with '.0' (and larger ones with an exponent), so the integer read back is the same double
    (-0.0 comes back as 0.0, which no sum tells apart). Only for arrays that hold no strings."""
    return encoded.replace(b".0,", b",").replace(b".0]", b"]")


def encode_revisions(revisions: list[Revision]) -> str:
    """The events as a JSON list, raters' without their source: state judged by raters alone is
    stored as before sources were."""
    return orjson.dumps([revision[:3] if revision[3] == RATERS else revision for revision in revisions]).decode()


def revisions_tail(revisions: list[Revision]) -> str:
    """The events as the tail of a JSON list: what a commit appends inside the stored list's brackets."""
    return encode_revisions(revisions)[1:-1]


def decode_revisions(raw: bytes | str) -> list[Revision]:
    """The events of a stored list; one without a source is raters' (all of formats 1 to 3)."""
    return [(r[0], r[1], r[2], r[3] if len(r) > 3 else RATERS) for r in orjson.loads(raw)]


def state_fields(state: QueryState) -> dict[bytes, bytes]:
    """The whole state as hash fields, as a Redis client would return them."""
    fields = {revisions_field(doc).encode(): encode_revisions(seen).encode() for doc, seen in state.revisions.items()}
    for (bucket, segment), group in state.groups.items():
        fields[group_field(bucket, segment).encode()] = encode_group(group).encode()
    return fields


def state_from_fields(fields: Mapping[Any, Any]) -> QueryState:
    """A query state from its hash fields, bytes as the Redis client returns them (typed Any there)."""
    state = QueryState()
    for name, value in fields.items():
        if name.startswith(b"r|"):
            state.revisions[name[2:].decode()] = decode_revisions(value)
        elif name.startswith(b"g|"):
            _, bucket, segment = name.decode().split("|", 2)
            state.groups[(int(bucket), segment)] = decode_group(value)
    return state


def changed_fields(state: QueryState, change: QueryChange, compact: Collection[tuple[int, str]] = (),
                   moved: Collection[tuple[int, str]] = ()) -> tuple[list[str], list[str], list[list[str]]]:
    """What a batch changed in a stored state: fields to write (name, value, name, value...),
    fields to delete, and [field, `revisions_tail`] to append to. The `compact` groups are written
    elsewhere (`state.compact_format`), and the fields of those `moved` there are deleted."""
    written: list[str] = []
    for bucket, segment in change.dirty & state.groups.keys():
        if (bucket, segment) not in compact:
            written += [group_field(bucket, segment), encode_group(state.groups[(bucket, segment)])]
    removed = [group_field(bucket, segment) for bucket, segment in [*change.removed, *moved]]
    # A document's events are appended to the list held, unless old ones were forgotten: then the
    # list is written whole.
    for doc in change.pruned:
        written += [revisions_field(doc), encode_revisions(state.revisions[doc])]
    appended = [[revisions_field(doc), revisions_tail(new)] for doc, new in change.revised.items()
                if doc not in change.pruned]
    return written, removed, appended


def list_field(segment: str, ranked: Iterable[str], positions: Mapping[str, int]) -> str:
    """A list's field: `positions` maps each document of its group to its index in the group's ranks."""
    # A segment key is JSON, which escapes every control character: the first \x1f ends it.
    return segment + "\x1f" + ",".join([str(positions[doc]) for doc in ranked])


def list_increments(outcome: BatchOutcome, compact: Collection[tuple[str, int, str]] = ()
                    ) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """The batch's new impressions of ranked lists: (query, bucket) -> [(field, impressions)];
    none of the `compact` groups (query, bucket, segment), which hold their lists themselves."""
    increments: dict[tuple[str, int], list[tuple[str, int]]] = {}
    positions_of: dict[tuple[str, int, str], dict[str, int]] = {}
    for (query_id, bucket, segment, ranked), count in outcome.lists.items():
        if (query_id, bucket, segment) in compact:
            continue
        positions = positions_of.get((query_id, bucket, segment))
        if positions is None:
            ranks = outcome.touched[query_id].groups[(bucket, segment)].ranks
            positions = positions_of[(query_id, bucket, segment)] = {doc: i for i, doc in enumerate(ranks)}
        increments.setdefault((query_id, bucket), []).append((list_field(segment, ranked, positions), count))
    return increments


def decode_list_field(raw: bytes | str, documents: Mapping[str, list[str]]) -> tuple[str, tuple[str, ...]] | None:
    """(segment, list) of a field of one bucket's lists; `documents` maps each segment of the
    bucket to its group's documents in order. None for a list whose group is gone (behind the
    horizon: its bucket's hash expires with it) or was started again while the hash lived on (it
    names positions the group has not got)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    if text.startswith("["):
        segment, ranked = orjson.loads(text)
        return segment, tuple(ranked)
    segment, _, positions = text.partition("\x1f")
    docs = documents.get(segment)
    indices = [int(p) for p in positions.split(",")] if positions else []
    if docs is None or any(i >= len(docs) for i in indices):
        return None
    return segment, tuple(docs[i] for i in indices)


def aggregate_field(segment: str, name: str) -> str:
    return f"{segment}|{name}"


def aggregate_increments(outcome: BatchOutcome) -> dict[int, list[tuple[str, str]]]:
    """The batch's changes of the aggregate sums: bucket -> [(field, increment)]."""
    increments: dict[int, list[tuple[str, str]]] = {}
    for (bucket, segment, name), change in outcome.aggregates.items():
        increments.setdefault(bucket, []).append((aggregate_field(segment, name), encode_sum(change)))
    return increments


def decode_aggregate_field(raw: bytes | str) -> tuple[str, str]:
    """(segment, field); a segment key may hold '|', a field name never does."""
    segment, _, name = (raw.decode() if isinstance(raw, bytes) else raw).rpartition("|")
    return segment, name


def encode_sum(value: float) -> str:
    # repr() is the shortest string that reads back as the same double.
    return repr(value)


def row_field(segment: str, query_id: str) -> str:
    # A segment key is JSON, which escapes every control character: the first \x1f ends it.
    return f"{segment}\x1f{query_id}"


def decode_row_field(raw: bytes | str) -> tuple[str, str]:
    """(segment, query id) of a row's field."""
    segment, _, query_id = (raw.decode() if isinstance(raw, bytes) else raw).partition("\x1f")
    return segment, query_id


def encode_row(row: Row) -> str:
    # orjson writes each double as the shortest text that reads back as the same double (as
    # repr does), in C: a row is written for every group a batch re-credits.
    return whole_numbers_short(orjson.dumps(row)).decode()[1:-1]


def decode_row(raw: bytes | str) -> Row:
    return tuple(map(float, orjson.loads(b"[" + (raw if isinstance(raw, bytes) else raw.encode()) + b"]")))


def row_writes(outcome: BatchOutcome, encode: Callable[[Row], str] = encode_row) -> dict[int, list[str]]:
    """The batch's drill-down rows: bucket -> [field, value, field, value...]."""
    writes: dict[int, list[str]] = {}
    for (query_id, bucket, segment), row in outcome.rows.items():
        writes.setdefault(bucket, []).extend((row_field(segment, query_id), encode(row)))
    return writes
