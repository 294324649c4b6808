"""A group's ranked lists as its stored form writes them: each a string of its documents' indices.

Pure, standard library only, and compiled with the core: reading a head query's state back from
Redis decodes thousands of lists (`state.compact_format.groups_from_fields`), each a field of a
few bytes. An index below len(DIGITS) is one character, chr(34 + index); a larger one is
'!<index>!'.

    listed = "".join(position(i) for i in (0, 1, 200))   # '"#!200!'
    values, lists = split_fields({b"d": b"a\x1fb", b"5.0:" + listed.encode(): b"3", ...})
    decode_lists(lists[b"5.0"], docs, group.lists, group.ranks)
"""

from __future__ import annotations

from typing import Final

from stream_ndcg.group_sums import Ranks

# The characters of the indices below len(DIGITS), and the one that opens and closes a larger index.
_FIRST: Final = 34
_END: Final = 127
_LONG: Final = 33
DIGITS = "".join(chr(c) for c in range(_FIRST, _END))


def position(index: int) -> str:
    return DIGITS[index] if index < len(DIGITS) else f"!{index}!"


def split_fields(fields: dict[bytes, bytes]) -> tuple[dict[bytes, list[tuple[int, bytes]]],
                                                     dict[bytes, list[tuple[bytes, bytes]]]]:
    """A compact hash's fields (`state.compact_format`) as the Redis client gives them: its values by
    name, each a list of (piece, text); and its groups' lists by the group's name, each a list of
    (positions, impressions), in their order. The names are those `compact_format` writes (`pieces`,
    `compact_changes`): '<group>:<positions>' a list, '<name>~<n>' piece n of a value."""
    values: dict[bytes, list[tuple[int, bytes]]] = {}
    lists: dict[bytes, list[tuple[bytes, bytes]]] = {}
    for name, value in fields.items():
        base, colon, listed = name.partition(b":")
        if colon:
            held = lists.get(base)
            if held is None:
                lists[base] = [(listed, value)]
            else:
                held.append((listed, value))
            continue
        base, _, piece = name.partition(b"~")
        pieces = values.get(base)
        if pieces is None:
            pieces = values[base] = []
        pieces.append((int(piece) if piece else 0, value))
    return values, lists


def decode_lists(encoded: list[tuple[bytes, bytes]], docs: list[str], lists: dict[tuple[str, ...], int],
                 ranks: Ranks) -> None:
    """A group's stored lists, (positions, impressions) as the Redis client gives them, added to its
    `lists` and its index (`ranks`) in their order, as `query_state.Group.add_list` adds a list
    (`group_sums.index_list`: each document at its first rank; a stored list is cut at the
    measure's depth already)."""
    # The number of the list that last showed each document: a repeat within a list is known by
    # its index, without a set per list.
    shown_in: list[int] = [-1] * len(docs)
    number = 0
    for listed, raw_count in encoded:
        count = int(raw_count)
        ranked: list[str] = []
        i = 0
        end = len(listed)
        while i < end:
            byte = listed[i]
            if byte == _LONG:
                close = listed.index(b"!", i + 1)
                index = int(listed[i + 1:close])
                i = close + 1
            elif _FIRST <= byte < _END:
                index = byte - _FIRST
                i += 1
            else:
                raise ValueError(f"not a stored list: {listed!r}")
            doc = docs[index]
            ranked.append(doc)
            if shown_in[index] == number:
                continue
            shown_in[index] = number
            at = ranks.get(doc)
            if at is None:
                ranks[doc] = {len(ranked): count}
            else:
                rank = len(ranked)
                at[rank] = at.get(rank, 0) + count
        lists[tuple(ranked)] = count
        number += 1
