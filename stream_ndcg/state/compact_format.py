"""The stored form of a query's impression groups since state format 7: one compact hash per query.

A query's groups of every bucket and segment, with their ranked lists, are one hash,
``{ns:P}:g:<query_id>`` (`state.redis_scripts`), which expires with its newest bucket (the
horizon), apart from the query's judgments (format 6's hash, `state.format`, which keeps them for
the judgment TTL). Its fields are short enough for Redis to keep a query of the tail as a listpack
(`hash-max-listpack-value`, 64 bytes by default; `hash-max-listpack-entries`, 128):

    d, d~1, ...            the query's documents, interned: the first time a group shows one it gets
                           the next index; ``\\x1f``-joined (a JSON list when a document id holds
                           \\x1f or the first starts with '['), cut into pieces of at most 64 bytes
    s, s~1, ...            the query's segments, interned the same way (\\x1f-joined: a segment key
                           is JSON, which escapes every control character)
    <bucket>.<s>, ~1, ...  a group: impressions, then what it credited (`credited_text`: the sums
                           as `sums_text.numbers_text` writes them), in pieces
    <bucket>.<s>:<list>    a ranked list's impressions; the list is its documents' indices, one
                           character each below 93 (`stored_lists.position`), '!<index>!' from there on

Drill-down rows keep format 6's place and form (`state.format`), their long sums dense as a
group's are (`state.shard_format.encode_row`, which format 8 shards).

A group's ranks are not stored: they are its lists' first occurrences (`Group.add_list`), each
list being cut at the measure's depth already. A group's lists are written when they change, its
header whenever it does; the documents' table only grows while the hash lives, and is written
afresh, with every group, once it holds more than twice the documents the live groups show.

Groups of formats 1 to 6 stay in the query's hash until they change: a group whose lists are all
known (every impression in a list) is then written here and its old field removed, in the same
commit; one whose lists are not (some impressions' lists were never stored, or expired) stays in
format 6 (`state.format`) until it falls behind the horizon.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from stream_ndcg.query_state import Group, QueryState
from stream_ndcg.state.format import credited_layout, sums_in_stored_order
from stream_ndcg.state.sums_text import numbers_of, numbers_text
from stream_ndcg.stored_lists import decode_lists, position, split_fields

# The longest value and field name kept in a listpack by a server's defaults.
PIECE = 64


def credited_text(group: Group, repeats: bool = False) -> str:
    """impressions, then the credited sums: `[cut-offs joined by '/'], then the sums in their
    stored order (`state.format`), or a JSON object for any other set of sums."""
    layout = _stored_order(tuple(group.credited))
    if layout is None:
        return f"{group.impressions},{orjson.dumps(group.credited).decode()}"
    cutoffs, take = layout
    return f"{group.impressions},{cutoffs},{numbers_text(take(group.credited), repeats)}"


@functools.cache
def _stored_order(names: tuple[str, ...]) -> tuple[str, Callable[[Mapping[str, float]], Sequence[float]]] | None:
    """For a group that credited `names`: its cut-offs' text and what takes its sums in their
    stored order, in C (`credited_layout`); None: stored by name."""
    layout = credited_layout(names)
    if layout is None:
        return None
    cutoffs, ordered = layout
    # The getter of one name gives its value, not a tuple of one.
    take = operator.itemgetter(*ordered) if len(ordered) > 1 else lambda sums: (sums[ordered[0]],)
    return "/".join(map(str, cutoffs)), take


def credited_of(text: str) -> tuple[int, dict[str, float]]:
    impressions, _, rest = text.partition(",")
    if rest.startswith("{"):
        return int(impressions), {name: float(value) for name, value in orjson.loads(rest).items()}
    cutoff_text, _, sums_text = rest.partition(",")
    cutoffs = tuple(int(k) for k in cutoff_text.split("/"))
    sums = numbers_of(sums_text)
    names = sums_in_stored_order(cutoffs, len(sums) != 1 + 4 * len(cutoffs))
    return int(impressions), dict(zip(names, sums, strict=True))


def pieces(name: str, text: str) -> list[tuple[str, str]]:
    """A value cut into fields of at most PIECE bytes (of UTF-8): name, name~1, name~2, ..."""
    if len(text) <= PIECE and text.isascii():
        return [(name, text)]
    encoded = text.encode()
    if len(encoded) <= PIECE:
        return [(name, text)]
    cut: list[tuple[str, str]] = []
    start = 0
    while start < len(encoded):
        end = min(start + PIECE, len(encoded))
        # Not inside a character: a continuation byte is 0b10xxxxxx.
        while end < len(encoded) and encoded[end] & 0xC0 == 0x80:
            end -= 1
        cut.append((name if not cut else f"{name}~{len(cut)}", encoded[start:end].decode()))
        start = end
    return cut


def table_text(entries: list[str]) -> str:
    if entries and (entries[0].startswith("[") or any("\x1f" in entry for entry in entries)):
        return orjson.dumps(entries).decode()
    return "\x1f".join(entries)


def table_of(text: str) -> list[str]:
    if text.startswith("["):
        return list(orjson.loads(text))
    return text.split("\x1f") if text else []


@dataclass
class Interned:
    """A stored query's tables, as the hash holds them: kept with its state (`_TABLES`) so that a
    batch writes only what grew, and which of its groups the hash holds whole."""

    docs: list[str] = field(default_factory=list)
    doc_index: dict[str, int] = field(default_factory=dict)
    segments: list[str] = field(default_factory=list)
    segment_index: dict[str, int] = field(default_factory=dict)
    # The pieces each stored value has (a table's, a group header's), to remove those it no longer needs.
    piece_counts: dict[str, int] = field(default_factory=dict)
    # The table's length when it was last looked at for documents no group shows any more.
    checked: int = 16
    # (bucket, segment) -> the group the hash holds with all its lists (until it is written
    # again: a group the engine dropped is removed with its lists at the query's next write).
    stored: dict[tuple[int, str], Group] = field(default_factory=dict)

    def doc(self, doc: str) -> int:
        index = self.doc_index.get(doc)
        if index is None:
            index = self.doc_index[doc] = len(self.docs)
            self.docs.append(doc)
        return index

    def segment(self, segment: str) -> int:
        index = self.segment_index.get(segment)
        if index is None:
            index = self.segment_index[segment] = len(self.segments)
            self.segments.append(segment)
        return index


class _Tables:
    """Each live query state's `Interned`, by the state's identity, held by a weak reference (as
    `state.format`'s rank encodings are): it goes with its state and never answers for another."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[weakref.ref[QueryState], Interned]] = {}

    def get(self, state: QueryState) -> Interned | None:
        held = self._held.get(id(state))
        return held[1] if held is not None and held[0]() is state else None

    def put(self, state: QueryState, interned: Interned) -> Interned:
        key = id(state)
        self._held[key] = (weakref.ref(state, lambda _: self._forget(key)), interned)
        return interned

    def _forget(self, key: int) -> None:
        held = self._held.get(key)
        if held is not None and held[0]() is None:
            self._held.pop(key, None)


_TABLES = _Tables()


def groups_from_fields(state: QueryState, fields: dict[bytes, bytes]) -> None:
    """Add the groups of a query's compact hash (bytes from the Redis client) to its state."""
    # A group's lists are most of a hash's fields: they stay in bytes for `stored_lists`, compiled
    # with the core.
    values, lists = split_fields(fields)
    interned = Interned()
    # A value is cut between characters (`pieces`): its pieces joined decode as one. Most have one.
    joined = {name: parts[0][1].decode() if len(parts) == 1 else b"".join([text for _, text in sorted(parts)]).decode()
              for name, parts in values.items()}
    interned.piece_counts = {name.decode(): len(parts) for name, parts in values.items()}
    interned.docs, interned.doc_index = _table(table_of(joined.pop(b"d", "")))
    interned.segments, interned.segment_index = _table(table_of(joined.pop(b"s", "")))
    groups: dict[bytes, Group] = {}
    for name, text in joined.items():
        bucket, _, segment_index = name.partition(b".")
        key = (int(bucket), interned.segments[int(segment_index)])
        impressions, credited = credited_of(text)
        group = groups[name] = state.groups[key] = Group(impressions=impressions, credited=credited)
        interned.stored[key] = group
    for name, encoded in lists.items():
        group = groups[name]
        decode_lists(encoded, interned.docs, group.lists, group.ranks)
    _TABLES.put(state, interned)


def _table(entries: list[str]) -> tuple[list[str], dict[str, int]]:
    """A table's entries and each one's index, as interning them one by one gives them."""
    index = dict(zip(entries, range(len(entries)), strict=True))
    if len(index) != len(entries):
        # A repeat (never written) keeps its first index.
        entries = list(dict.fromkeys(entries))
        index = dict(zip(entries, range(len(entries)), strict=True))
    return entries, index


def holds(state: QueryState, key: tuple[int, str]) -> bool:
    """Whether the query's compact hash holds the group as the state has it (its lists whole)."""
    interned = _TABLES.get(state)
    return interned is not None and interned.stored.get(key) is state.groups.get(key)


def whole_lists(group: Group) -> bool:
    """Whether every impression of a group is in one of its lists: only such a group is stored here."""
    return sum(group.lists.values()) == group.impressions


@dataclass
class CompactWrite:
    """What a batch writes to a query's compact hash: fields to set (name, value, ...) and to
    remove, and whether the hash is written afresh (removed whole first)."""

    written: list[str]
    removed: list[str]
    afresh: bool


def compact_changes(state: QueryState, dirty: Iterable[tuple[int, str]], removed: Iterable[tuple[int, str]],
                    changed_lists: Mapping[tuple[int, str], Iterable[tuple[str, ...]]],
                    repeats: bool = False) -> CompactWrite:
    """What to write for the `dirty` groups (each with all its lists: `whole_lists`), the
    `removed` ones and, per group, the lists the batch showed."""
    interned = _TABLES.get(state)
    if interned is None:
        interned = _TABLES.put(state, Interned())
    written: list[str] = []
    gone: list[str] = []
    keys = [key for key in dirty if key in state.groups]
    for key in removed:
        dropped = interned.stored.pop(key, None)
        if dropped is not None:
            name = f"{key[0]}.{interned.segment_index[key[1]]}"
            gone += [piece for piece, _ in _named_pieces(name, interned.piece_counts.pop(name, 1))]
            gone += [f"{name}:{_listed(interned, ranked)}" for ranked in dropped.lists]
    if gone and not keys and not interned.stored:
        # Its last group went: the hash goes whole, tables and all.
        _TABLES.put(state, Interned())
        return CompactWrite([], [], afresh=True)
    docs_before, segments_before = len(interned.docs), len(interned.segments)
    _intern(interned, state, keys, changed_lists)
    # Looked at each time the table has doubled since it was last looked at: no more than once per
    # document added, whatever the query's groups hold.
    afresh = False
    if len(interned.docs) >= 2 * interned.checked:
        afresh = len(interned.docs) > 2 * len({doc for group in state.groups.values() for doc in group.ranks})
        interned.checked = len(interned.docs)
    if afresh:
        # Written afresh: every group the hash held, with every list, numbered from a new table.
        held = [key for key in interned.stored if key in state.groups]
        interned = _TABLES.put(state, Interned())
        keys = list(dict.fromkeys([*held, *keys]))
        _intern(interned, state, keys, changed_lists)
        docs_before = segments_before = 0
        gone = []
    if len(interned.docs) != docs_before:
        written += _table_fields(interned, "d", interned.docs, gone)
    if len(interned.segments) != segments_before:
        written += _table_fields(interned, "s", interned.segments, gone)
    for key in keys:
        group = state.groups[key]
        name = f"{key[0]}.{interned.segment_index[key[1]]}"
        written += _value_fields(interned, name, credited_text(group, repeats), gone)
        whole = interned.stored.get(key) is not group
        interned.stored[key] = group
        for ranked in (group.lists if whole else changed_lists.get(key, ())):
            written += [f"{name}:{_listed(interned, ranked)}", str(group.lists[ranked])]
    return CompactWrite(written, gone, afresh)


def _intern(interned: Interned, state: QueryState, keys: Iterable[tuple[int, str]],
            changed_lists: Mapping[tuple[int, str], Iterable[tuple[str, ...]]]) -> None:
    """Give the groups' segments and documents their indices: of a group the hash holds, only
    those of the lists the batch showed can be new (a judgment writes every group of its query
    under the pool ideal: walking their documents would cost in proportion to all they show)."""
    for key in keys:
        interned.segment(key[1])
        group = state.groups[key]
        if interned.stored.get(key) is group:
            for ranked in changed_lists.get(key, ()):
                for doc in ranked:
                    interned.doc(doc)
        else:
            for doc in group.ranks:
                interned.doc(doc)


def _listed(interned: Interned, ranked: tuple[str, ...]) -> str:
    return "".join([position(interned.doc_index[doc]) for doc in ranked])


def _named_pieces(name: str, count: int) -> list[tuple[str, int]]:
    return [(name if i == 0 else f"{name}~{i}", i) for i in range(count)]


def _value_fields(interned: Interned, name: str, text: str, gone: list[str]) -> list[str]:
    cut = pieces(name, text)
    before = interned.piece_counts.get(name, 0)
    gone += [f"{name}~{i}" for i in range(len(cut), before)]
    interned.piece_counts[name] = len(cut)
    return [item for piece in cut for item in piece]


def _table_fields(interned: Interned, name: str, entries: list[str], gone: list[str]) -> list[str]:
    return _value_fields(interned, name, table_text(entries), gone)


def compact_lists(fields: dict[bytes, bytes]) -> dict[tuple[int, str, tuple[str, ...]], int]:
    """(bucket, segment, list) -> impressions, of a query's compact hash."""
    state = QueryState()
    groups_from_fields(state, fields)
    return {(bucket, segment, ranked): count for (bucket, segment), group in state.groups.items()
            for ranked, count in group.lists.items()}
